"""Variants in memory: the per-module tensors a VariantLinear adds to the base, loaded from blobs.

A LoRA variant (kinds `lora` and `merged`, both stored in PEFT's format) holds, per module,
A[r, in], B[out, r] and the PEFT scaling (lora_alpha / r, or / sqrt(r) with rsLoRA). A BitDelta
variant holds, per module, the packed signs uint8[out, ceil(in/8)] and α[out].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from zenedge.adapters.lora_tensors import read_lora_factors
from zenedge.errors import InvalidAdapter
from zenedge.merge.factors import LoraFactors


@dataclass
class BitDeltaModule:
    packed: torch.Tensor  # uint8 [out, ceil(in/8)]; on the CPU a transposed view of [in/8, out] bytes (load_bitdelta)
    alpha: torch.Tensor   # fp32 [out]
    in_features: int
    dense: object | None = None  # cached W_base + α⊙S for hot variants: a tensor or a CpuWeight (cpu_weights.py)


@dataclass
class Variant:
    """One servable variant. `key` identifies it in caches (the adapter id)."""

    key: str
    kind: str                      # "lora" | "merged" | "bitdelta"
    modules: dict[str, LoraFactors | BitDeltaModule]
    nbytes: int = 0

    @property
    def is_bitdelta(self) -> bool:
        return self.kind == "bitdelta"

    def finite(self) -> bool:
        """Whether every number it adds is finite (packed signs always are)."""
        tensors = [t for m in self.modules.values()
                   for t in ((m.alpha,) if isinstance(m, BitDeltaModule) else (m.A, m.B))]
        return all(bool(torch.isfinite(t).all()) for t in tensors)


def load_lora(key: str, kind: str, weights: Path, config: dict, device: torch.device,
              dtype: torch.dtype) -> Variant:
    # B is kept as the transpose of a contiguous Bᵀ [r, out]: a decode step reads it row by row in
    # that order (kernels/native/lora_add.c, and torch's products take either layout), at no extra memory.
    modules: dict[str, LoraFactors | BitDeltaModule] = {
        module: LoraFactors(f.A, f.B.t().contiguous().t(), f.scale)
        for module, f in read_lora_factors(weights, config, device=device, dtype=dtype).items()}
    nbytes = sum(f.A.numel() * f.A.element_size() + f.B.numel() * f.B.element_size() for f in modules.values())
    return Variant(key, kind, modules, nbytes)


def lora_variant(key: str, factors: dict[str, LoraFactors], resident, kind: str = "merged") -> Variant:
    """An in-memory LoRA variant (e.g. a merge being gated) on the resident's device and dtype."""
    device, dtype = resident.device, resident.dtype
    modules = {m: LoraFactors(f.A.to(device, dtype), f.B.to(device, dtype), f.scale) for m, f in factors.items()}
    return Variant(key, kind, modules)


def load_bitdelta(key: str, weights: Path, device: torch.device) -> Variant:
    from zenedge.bitdelta.fileformat import load_bitdelta as read_file

    data = read_file(weights)
    if data.extra:
        # Per-row serving swaps linears only; a changed norm or embedding would be silently lost.
        raise InvalidAdapter(f"BitDelta file changes non-projection tensors ({', '.join(sorted(data.extra)[:3])}…), "
                             "which zenedge cannot apply per request")
    modules: dict[str, LoraFactors | BitDeltaModule] = {}
    nbytes = 0
    for module, (packed, alpha, in_features) in data.modules.items():
        packed = packed.to(device).contiguous()
        if device.type == "cpu":
            # the same bytes by input byte ([in/8, out], seen as [out, in/8]): the C sign kernel
            # (kernels/native/sign_add.c) reads one byte of 32 rows at a time, as it is stored
            packed = packed.t().contiguous().t()
        alpha = alpha.to(device=device, dtype=torch.float32).contiguous()
        modules[module] = BitDeltaModule(packed, alpha, in_features)
        nbytes += packed.numel() + alpha.numel() * 4
    return Variant(key, "bitdelta", modules, nbytes)
