"""Which device, dtype and CPU weight format the runtime uses. CUDA: bf16, full weights. CPU: fp32
activations with int4 weight-only decoder linears and a bf16 output head, unless
`runtime.device` / `runtime.dtype` / `runtime.weights` say otherwise (cpu_weights.py).

Why int4 is the CPU default: decode streams every weight once per token, so bytes per weight
decide the speed. bf16 halves them, but torch's CPU bf16 kernels did not turn that into speed;
int4 reads a sixth of fp32's bytes, through the C kernels of kernels/, for an answer loss and
exact-match scores close to fp32's on the profiles' eval sets (BENCHMARKS.md has the figures).
Greedy text can still change where fp32 is nearly undecided between two tokens, as with bf16;
`runtime.weights = "full"` gives fp32's exact numbers."""

from __future__ import annotations

import torch

from zenedge.errors import Unavailable

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(setting: str = "auto") -> torch.device:
    if setting == "cuda" and not torch.cuda.is_available():
        raise Unavailable("runtime.device is \"cuda\" but no CUDA device is available",
                          hint='set runtime.device = "auto" or "cpu"')
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def pick_dtype(setting: str, device: torch.device) -> torch.dtype:
    if setting != "auto":
        return _DTYPES[setting]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def pick_weights(setting: str, device: torch.device) -> str:
    """The CPU matmul weight format: "full" (the dtype's own weights), "int8" or "int4"."""
    from zenedge.runtime.cpu_weights import quantized_kernels_available

    if setting == "auto":   # int4 on CPU: the module docstring says why
        return "int4" if device.type == "cpu" and quantized_kernels_available("int4") else "full"
    if setting != "full" and device.type != "cpu":
        raise Unavailable(f'runtime.weights = "{setting}" is a CPU format; on {device.type} the weights stay full',
                          hint='set runtime.weights = "auto"')
    if setting != "full" and not quantized_kernels_available(setting):
        raise Unavailable(f'runtime.weights = "{setting}" needs a torch with its CPU kernel ({torch.__version__} has none)',
                          hint='set runtime.weights = "auto" or upgrade torch')
    return setting
