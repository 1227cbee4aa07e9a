"""The adapter representation the merge math works on, and products computed in low rank.

A LoRA adapter is `dict[str, LoraFactors]`, keyed by module name
("model.layers.0.self_attn.q_proj"). One module's update is

    ΔW = scale · B @ A,      A: [r, in],  B: [out, r],  scale = lora_alpha / r (PEFT's scaling)

Scaling is KEPT AS A FIELD, not folded into B: that way an adapter read from a PEFT file is
used as stored (no copy to fold the scale), K-Merge's factor-space mixing can apply PEFT's
`weight · scaling` under its square roots exactly as PEFT does, and the similarity measure,
which is scale-free, never has to undo a fold. Everything the merge math PRODUCES has
`scale == 1.0`, with the singular values split evenly between the factors
(B = U·√σ, A = √σ·Vᵀ), which is PEFT's convention for merged adapters (lora_alpha = r).

Products are taken in low rank: ⟨B1A1, B2A2⟩_F = sum((B1ᵀB2) ⊙ (A1A2ᵀ)) costs
O((out+in)·r1·r2) and never builds an out×in matrix.

Arithmetic runs in the inputs' dtype promoted to at least float32 (`compute_dtype`): bf16
factors are widened before any QR or SVD; float64 inputs stay float64 (the tests use that).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from zenedge.merge.errors import IncompatibleAdapters, NonFiniteValues


@dataclass(frozen=True)
class LoraFactors:
    """One module's low-rank update ΔW = scale · B @ A (A: [r, in], B: [out, r])."""

    A: Tensor
    B: Tensor
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.A.ndim != 2 or self.B.ndim != 2:
            raise IncompatibleAdapters(
                f"LoRA factors must be 2-D, got A{tuple(self.A.shape)} and B{tuple(self.B.shape)}"
            )
        if self.B.shape[1] != self.A.shape[0]:
            raise IncompatibleAdapters(
                f"rank mismatch: B{tuple(self.B.shape)} @ A{tuple(self.A.shape)}"
            )
        if not math.isfinite(float(self.scale)):
            raise NonFiniteValues(f"LoRA scale is {self.scale}")

    @property
    def rank(self) -> int:
        return self.A.shape[0]

    @cached_property
    def transposed(self) -> tuple[Tensor, Tensor]:
        """(Aᵀ, Bᵀ) as views, made once: the decode loop multiplies x·Aᵀ·Bᵀ for every module and
        token, and a `.t()` per call costs as much as the small product itself."""
        return self.A.t(), self.B.t()

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of ΔW: (out, in)."""
        return (self.B.shape[0], self.A.shape[1])

    def delta(self) -> Tensor:
        """Dense ΔW [out, in]. O(out·in): for tests, dense reference paths and merged-model export."""
        dtype = compute_dtype(self.A, self.B)
        return self.scale * (self.B.to(dtype) @ self.A.to(dtype))

    def scaled_B(self) -> Tensor:
        """B with the scale applied (in the compute dtype), so ΔW = scaled_B() @ A."""
        return self.scale * self.B.to(compute_dtype(self.A, self.B))

    def clone(self) -> LoraFactors:
        return LoraFactors(self.A.clone(), self.B.clone(), float(self.scale))

    def padded(self, rank: int) -> LoraFactors:
        """Same ΔW with zero rows/columns added up to `rank` (for a store that wants one r)."""
        if rank < self.rank:
            raise IncompatibleAdapters(f"cannot pad rank {self.rank} down to {rank}")
        extra = rank - self.rank
        A = torch.cat([self.A, self.A.new_zeros(extra, self.A.shape[1])], dim=0)
        B = torch.cat([self.B, self.B.new_zeros(self.B.shape[0], extra)], dim=1)
        return LoraFactors(A, B, self.scale)


# The merge math reads adapters through Mapping so callers may pass any dict-like view.
Adapter = Mapping[str, LoraFactors]


def as_factors(value: LoraFactors | tuple, what: str) -> LoraFactors:
    """Accept DESIGN.md's tuple form too: (A, B) means scale 1, (A, B, scale) as given."""
    if isinstance(value, LoraFactors):
        return value
    if isinstance(value, (tuple, list)) and len(value) in (2, 3) and all(isinstance(t, Tensor) for t in value[:2]):
        return LoraFactors(*value)
    raise IncompatibleAdapters(f"{what}: expected LoraFactors or (A, B[, scale]), got {type(value).__name__}")


def as_adapter(adapter: Mapping[str, LoraFactors | tuple], what: str) -> dict[str, LoraFactors]:
    """The adapter with every module as LoraFactors (tuples converted; tensors not copied)."""
    return {name: as_factors(value, f"{what}, module {name!r}") for name, value in adapter.items()}


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype arithmetic runs in: the promoted input dtype, at least float32."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def factor_inner(x: LoraFactors, y: LoraFactors) -> Tensor:
    """⟨ΔW_x, ΔW_y⟩_F = s_x s_y · sum((B_xᵀB_y) ⊙ (A_x A_yᵀ)), a 0-d tensor. Never out×in."""
    if x.shape != y.shape:
        raise IncompatibleAdapters(f"cannot compare ΔW of shapes {x.shape} and {y.shape}")
    dtype = compute_dtype(x.A, x.B, y.A, y.B)
    gram_B = x.B.to(dtype).T @ y.B.to(dtype)  # [r_x, r_y]
    gram_A = x.A.to(dtype) @ y.A.to(dtype).T  # [r_x, r_y]
    return (x.scale * y.scale) * (gram_B * gram_A).sum()


def factor_norm_sq(x: LoraFactors) -> Tensor:
    """‖ΔW‖_F² in low rank (0-d tensor)."""
    return factor_inner(x, x).clamp_min(0.0)  # rounding can leave a −1e-20 for ΔW = 0


def adapter_norm(adapter: Adapter) -> float:
    """Norm of the whole flattened update: sqrt(Σ_modules ‖ΔW_m‖_F²)."""
    return math.sqrt(sum(float(factor_norm_sq(f)) for f in adapter.values()))


def require_finite_tensor(t: Tensor, what: str) -> None:
    if not bool(torch.isfinite(t).all()):
        raise NonFiniteValues(f"{what} holds NaN or inf values")


def require_finite_adapter(adapter: Adapter, what: str) -> None:
    """Raise NonFiniteValues naming the first module whose A, B or scale is not finite."""
    for name, f in adapter.items():
        if not isinstance(f, LoraFactors):
            raise IncompatibleAdapters(f"{what}: module {name!r} is {type(f).__name__}, not LoraFactors")
        require_finite_tensor(f.A, f"{what}: module {name!r} factor A")
        require_finite_tensor(f.B, f"{what}: module {name!r} factor B")


def require_same_shapes(adapters: Iterable[Adapter]) -> None:
    """Every module present in several adapters must have one ΔW shape."""
    seen: dict[str, tuple[int, int]] = {}
    for adapter in adapters:
        for name, f in adapter.items():
            if seen.setdefault(name, f.shape) != f.shape:
                raise IncompatibleAdapters(
                    f"module {name!r} has ΔW shape {seen[name]} in one adapter and {f.shape} in another"
                )


def module_union(adapters: Iterable[Adapter]) -> list[str]:
    """Module names present in any adapter, in first-seen order (deterministic output order)."""
    names: dict[str, None] = {}
    for adapter in adapters:
        names.update(dict.fromkeys(adapter))
    return list(names)
