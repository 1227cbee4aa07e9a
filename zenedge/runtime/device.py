"""Which device and dtype the runtime uses: CUDA in bf16 when present; on CPU bf16 where torch's
oneDNN has a bf16 linear (the weights are then packed for it, cpu_weights.py), else fp32; unless
`runtime.device` / `runtime.dtype` say otherwise. "float32" stays selectable everywhere.

Why bf16 on CPU: decode streams every weight once per token, so half the bytes is the lever, but
only through oneDNN's packed linear; torch's plain bf16 F.linear is no faster than fp32 on the
machines we measured. Numbers and greedy agreement with fp32: BENCHMARKS.md."""

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
    if device.type == "cuda":
        return torch.bfloat16
    from zenedge.runtime.cpu_weights import packing_available

    return torch.bfloat16 if packing_available(torch.bfloat16, device) else torch.float32
