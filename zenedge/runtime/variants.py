"""Variants in memory: the per-module tensors a VariantLinear adds to the base, loaded from blobs.

A LoRA variant (kinds `lora` and `merged`, both stored in PEFT's format) holds, per module,
A[r, in], B[out, r] and the PEFT scaling (lora_alpha / r, or / sqrt(r) with rsLoRA). A BitDelta
variant holds, per module, the packed signs uint8[out, ceil(in/8)] and α[out].
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from zenedge.errors import InvalidAdapter

_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")


@dataclass
class LoraModule:
    A: torch.Tensor      # [r, in]
    B: torch.Tensor      # [out, r]
    scale: float


@dataclass
class BitDeltaModule:
    packed: torch.Tensor  # uint8 [out, ceil(in/8)]
    alpha: torch.Tensor   # fp32 [out]
    in_features: int
    dense: torch.Tensor | None = None  # optional cached W_base + α⊙S for hot variants


@dataclass
class Variant:
    """One servable variant. `key` identifies it in caches (the adapter id)."""

    key: str
    kind: str                      # "lora" | "merged" | "bitdelta"
    modules: dict[str, LoraModule | BitDeltaModule]
    nbytes: int = 0
    extra: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def is_bitdelta(self) -> bool:
        return self.kind == "bitdelta"


def lora_scale(config: dict, module: str, rank: int) -> float:
    alpha = config.get("lora_alpha", config.get("r", rank))
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if module.endswith(pattern):
            alpha = value
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def load_lora(key: str, kind: str, weights: Path, config: dict, device: torch.device,
              dtype: torch.dtype) -> Variant:
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(weights), framework="pt", device="cpu") as handle:
        for name in handle.keys():
            match = _LORA_KEY.match(name)
            if not match:
                raise InvalidAdapter(f"unexpected tensor {name!r} in LoRA weights")
            pairs.setdefault(match["module"], {})[match["which"]] = handle.get_tensor(name)
    modules: dict[str, LoraModule | BitDeltaModule] = {}
    nbytes = 0
    for module, pair in pairs.items():
        a = pair["A"].to(device=device, dtype=dtype).contiguous()
        b = pair["B"].to(device=device, dtype=dtype).contiguous()
        modules[module] = LoraModule(a, b, lora_scale(config, module, a.shape[0]))
        nbytes += a.numel() * a.element_size() + b.numel() * b.element_size()
    return Variant(key, kind, modules, nbytes)


def load_bitdelta(key: str, weights: Path, device: torch.device) -> Variant:
    from zenedge.bitdelta.format import load_bitdelta as read_file

    data = read_file(weights)
    modules: dict[str, LoraModule | BitDeltaModule] = {}
    nbytes = 0
    for module, entry in data.modules.items():
        packed = entry.packed.to(device).contiguous()
        alpha = entry.alpha.to(device=device, dtype=torch.float32).contiguous()
        modules[module] = BitDeltaModule(packed, alpha, entry.in_features)
        nbytes += packed.numel() + alpha.numel() * 4
    extra = {name: t.to(device) for name, t in data.extra.items()}
    nbytes += sum(t.numel() * t.element_size() for t in extra.values())
    return Variant(key, "bitdelta", modules, nbytes, extra)
