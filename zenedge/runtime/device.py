"""Which device and dtype the runtime uses: CUDA in bf16 when present, else CPU in fp32, unless
`runtime.device` / `runtime.dtype` say otherwise. "bfloat16" on CPU is selectable and then uses
oneDNN-packed weights (cpu_weights.py).

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
