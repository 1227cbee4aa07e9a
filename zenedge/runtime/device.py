"""Which device, dtype and CPU weight format the runtime uses: CUDA in bf16 when present, else CPU
in fp32, unless `runtime.device` / `runtime.dtype` say otherwise. "bfloat16" on CPU is selectable
and then uses oneDNN-packed weights; `runtime.weights` = "int8" / "int4" serves the CPU matmuls
from weight-only quantized copies (cpu_weights.py).

Why fp32 stays the CPU default: decode streams every weight once per token, so bf16's half the
bytes should win, but on the machine we measured (BENCHMARKS.md) bf16 decode came out between
0.9× and 1.2× of fp32 depending on the neighbours' load (torch's plain bf16 linear is slower
than fp32; oneDNN's packed one is ~1.5× faster in isolation but not reliably so end to end),
and bf16 changes 40% of greedy answers (quality equal: same answer loss). Revisit with a
bandwidth-bound bf16 GEMV."""

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

    if setting == "auto":   # int4 on CPU: ~3× fp32's decode, answer loss within 0.01 (BENCHMARKS.md)
        return "int4" if device.type == "cpu" and quantized_kernels_available("int4") else "full"
    if setting != "full" and device.type != "cpu":
        raise Unavailable(f'runtime.weights = "{setting}" is a CPU format; on {device.type} the weights stay full',
                          hint='set runtime.weights = "auto"')
    if setting != "full" and not quantized_kernels_available(setting):
        raise Unavailable(f'runtime.weights = "{setting}" needs a torch with its CPU kernel ({torch.__version__} has none)',
                          hint='set runtime.weights = "auto" or upgrade torch')
    return setting
