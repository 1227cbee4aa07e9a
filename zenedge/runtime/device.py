"""Which device and dtype the runtime uses: CUDA in bf16 when present, else CPU in fp32,
unless `runtime.device` / `runtime.dtype` say otherwise."""

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
