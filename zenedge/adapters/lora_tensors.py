"""LoRA adapters as tensors: PEFT safetensors ⇄ `dict[module, LoraFactors]` (ΔW = scale·B·A)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from zenedge.errors import InvalidAdapter
from zenedge.merge.factors import LoraFactors

_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")


def lora_scale(config: dict, module: str, rank: int) -> float:
    """PEFT's scaling for one module: lora_alpha / r (or / sqrt(r) with rsLoRA), with patterns."""
    alpha = config.get("lora_alpha", config.get("r", rank))
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if module.endswith(pattern):
            alpha = value
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def read_lora_factors(weights: Path, config: dict, *, device: torch.device | str = "cpu",
                      dtype: torch.dtype | None = None) -> dict[str, LoraFactors]:
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(weights), framework="pt", device="cpu") as handle:
        for name in handle.keys():
            match = _KEY.match(name)
            if not match:
                raise InvalidAdapter(f"unexpected tensor {name!r} in LoRA weights")
            pairs.setdefault(match["module"], {})[match["which"]] = handle.get_tensor(name)
    factors = {}
    for module, pair in sorted(pairs.items()):
        a = pair["A"].to(device=device, dtype=dtype or pair["A"].dtype).contiguous()
        b = pair["B"].to(device=device, dtype=dtype or pair["B"].dtype).contiguous()
        factors[module] = LoraFactors(a, b, lora_scale(config, module, a.shape[0]))
    return factors


_STORED = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def stored_dtype(weights: Path) -> torch.dtype:
    """The widest float dtype among a LoRA file's tensors (what a merged adapter replacing it is
    written in, so it takes the bytes of the adapter it replaces, not twice them)."""
    from zenedge.adapters.safetensors_file import read_header

    dtypes = {_STORED[info.dtype] for info in read_header(weights).tensors.values() if info.dtype in _STORED}
    return max(dtypes, key=lambda d: (torch.finfo(d).bits, d == torch.bfloat16), default=torch.float32)


def round_to(factors: dict[str, LoraFactors], dtype: torch.dtype) -> dict[str, LoraFactors]:
    """The factors as they will read back after `write_peft_adapter(..., dtype=dtype)` (kept in
    their own dtype): what a gate must measure, since that is what is stored and served."""
    out = {}
    for module, f in factors.items():
        out[module] = LoraFactors(f.A.to(dtype).to(f.A.dtype), (f.B * f.scale).to(dtype).to(f.B.dtype), 1.0)
    return out


def write_peft_adapter(factors: dict[str, LoraFactors], directory: Path, *, base_model: str,
                       dtype: torch.dtype = torch.float32) -> dict:
    """Write factors as a PEFT LoRA directory (one uniform rank, scale folded so lora_alpha = r).

    Returns the adapter_config written. Modules of lower rank are zero-padded: PEFT needs one r
    per adapter unless rank_pattern is used, and padding keeps the files loadable everywhere.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rank = max(f.rank for f in factors.values())
    tensors = {}
    for module, f in factors.items():
        padded = f.padded(rank)
        # ΔW = s·B·A; store B' = s·B so the written adapter has scale lora_alpha/r = 1.
        tensors[f"base_model.model.{module}.lora_A.weight"] = padded.A.to(dtype).contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = (padded.B * padded.scale).to(dtype).contiguous()
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank,
        "target_modules": sorted({m.rsplit(".", 1)[-1] for m in factors}), "lora_dropout": 0.0,
        "bias": "none", "base_model_name_or_path": base_model, "fan_in_fan_out": False,
        "use_rslora": False, "inference_mode": True,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return config
