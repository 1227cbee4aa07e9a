"""LoRA adapters as tensors: PEFT safetensors (or the pool's quantized files, storage.py) ⇄
`dict[module, LoraFactors]` (ΔW = scale·B·A)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors import safe_open

from zenedge.adapters import storage
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
    """A stored or PEFT LoRA file's factors, in `dtype` (default: as stored; quantized files
    dequantize to float32)."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in _read(weights).items():
        match = _KEY.match(name)
        if not match:
            raise InvalidAdapter(f"unexpected tensor {name!r} in LoRA weights")
        pairs.setdefault(match["module"], {})[match["which"]] = tensor
    factors = {}
    for module, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise InvalidAdapter(f"{module}: LoRA weights need both lora_A and lora_B")
        a = pair["A"].to(device=device, dtype=dtype or pair["A"].dtype).contiguous()
        b = pair["B"].to(device=device, dtype=dtype or pair["B"].dtype).contiguous()
        factors[module] = LoraFactors(a, b, lora_scale(config, module, a.shape[0]))
    return factors


def _read(weights: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(weights), framework="pt", device="cpu") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        metadata = handle.metadata()
    try:
        return storage.decode(tensors, metadata)
    except (KeyError, ValueError, RuntimeError) as exc:
        raise InvalidAdapter(f"{Path(weights).name}: damaged quantized LoRA weights ({exc})") from None


def stored_format(weights: Path) -> str:
    """What a stored LoRA file is in (storage.FORMATS): its metadata's format, else the widest
    float dtype among its tensors. A merged adapter replacing it is written in the same one, so
    it takes the bytes of the adapter it replaces, not twice them."""
    from zenedge.adapters.safetensors_file import read_header

    header = read_header(weights)
    dtypes = {_STORED[info.dtype] for info in header.tensors.values() if info.dtype in _STORED}
    return storage.storage_of(dtypes, header.metadata)


_STORED = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def round_to(factors: dict[str, LoraFactors], storage_format: str) -> dict[str, LoraFactors]:
    """The factors as they will read back after `write_peft_adapter(..., storage=storage_format)`
    (kept in their own dtype): what a gate must measure, since that is what is stored and served."""
    tensors = peft_tensors(factors, rank=None)
    back = storage.decode(*storage.encode(tensors, storage_format))
    out = {}
    for module, f in factors.items():
        a, b = back[f"base_model.model.{module}.lora_A.weight"], back[f"base_model.model.{module}.lora_B.weight"]
        out[module] = LoraFactors(a.to(f.A.dtype), b.to(f.B.dtype), 1.0)
    return out


def peft_tensors(factors: dict[str, LoraFactors], rank: int | None) -> dict[str, torch.Tensor]:
    """PEFT-keyed A and s·B (the scale folded in, so lora_alpha = r), padded to `rank` if given."""
    tensors = {}
    for module, f in factors.items():
        f = f.padded(rank) if rank is not None else f
        tensors[f"base_model.model.{module}.lora_A.weight"] = f.A
        tensors[f"base_model.model.{module}.lora_B.weight"] = f.B * f.scale
    return tensors


def write_peft_adapter(factors: dict[str, LoraFactors], directory: Path, *, base_model: str,
                       storage_format: str = "fp32") -> dict:
    """Write factors as a PEFT LoRA directory (one uniform rank, scale folded so lora_alpha = r),
    the weights in `storage_format` (storage.FORMATS: a float one is a plain PEFT file).

    Returns the adapter_config written. Modules of lower rank are zero-padded: PEFT needs one r
    per adapter unless rank_pattern is used, and padding keeps the files loadable everywhere.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rank = max(f.rank for f in factors.values())
    (directory / "adapter_model.safetensors").write_bytes(storage.encoded_file(peft_tensors(factors, rank),
                                                                               storage_format))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank,
        "target_modules": sorted({m.rsplit(".", 1)[-1] for m in factors}), "lora_dropout": 0.0,
        "bias": "none", "base_model_name_or_path": base_model, "fan_in_fan_out": False,
        "use_rslora": False, "inference_mode": True,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return config
