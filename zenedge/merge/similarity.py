"""K-Merge's adapter similarity, computed in low rank, and a pool ranking built on it.

K-Merge (arXiv:2510.13537) scores a new LoRA against a slot by

    sim(a, b) = mean over modules m of cos(flatten(ΔW_a,m), flatten(ΔW_b,m)),   ΔW = B·A

ignoring the α/r scaling. Here:

* Modules may be given as LoraFactors or as DESIGN.md's (A, B) tuples (scale 1).
* The mean runs over the modules the two adapters SHARE (K-Merge's adapters all target the
  same modules; ours may not). No shared module: similarity 0.
* cos is taken on ΔW = scale·B·A. A positive scale cancels, so this is K-Merge's number for
  every ordinary adapter (lora_alpha > 0); a negative scale flips the sign, as it flips ΔW.
* ⟨B1A1, B2A2⟩_F = sum((B1ᵀB2) ⊙ (A1A2ᵀ)) and ‖BA‖² likewise: never an out×in matrix.
* A module whose ΔW is zero on either side (e.g. a fresh LoRA, B = 0) contributes cos = 0
  to the mean: defined, never NaN. Results are clamped to [−1, 1] against rounding.
* Non-finite factors are caught through the Gram products the measure computes anyway (a NaN
  or inf entry makes ‖BA‖² non-finite), so no separate pass over the pool is needed; a finite
  ΔW whose squared norm overflows is rejected the same way.

`SimilarityIndex` keeps a pool's per-module norms (add/remove members as the pool changes) and
answers a query with two small Gram products per (member, shared module). `lora_cosine` and
`rank_by_similarity` are one-off uses of the same code.

Why numpy in the inner loop: the products are tiny (576×8 by 576×8), so per-call overhead
dominates, and numpy's is a fraction of torch's (README.md beside this file has the numbers).
Why no stacking of the pool into [n, out, r] batches: the copy (mostly page faults on fresh
memory) costs more than the queries a pool sees, and doubles the memory the pool takes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from zenedge.merge.errors import IncompatibleAdapters, NonFiniteValues
from zenedge.merge.factors import Adapter, LoraFactors, as_adapter


@dataclass(frozen=True)
class _Module:
    """One module's factors as numpy views (no copy for float32/float64 on the CPU)."""

    B: np.ndarray  # [out, r], scale NOT folded in (folding would copy)
    A: np.ndarray  # [r, in]
    scale: float
    norm: float  # ‖ΔW‖_F, scale included

    @property
    def shape(self) -> tuple[int, int]:
        return (self.B.shape[0], self.A.shape[1])


def _as_numpy(t: Tensor) -> np.ndarray:
    # numpy has no bfloat16: half-precision factors are widened (the only copy made here).
    if t.dtype not in (torch.float32, torch.float64):
        t = t.to(torch.float32)
    return t.detach().cpu().numpy()


def _module(f: LoraFactors, what: str) -> _Module:
    B, A = _as_numpy(f.B), _as_numpy(f.A)
    norm_sq = float(f.scale) ** 2 * float(np.vdot(B.T @ B, A @ A.T))
    if not math.isfinite(norm_sq):
        raise NonFiniteValues(f"{what}: ΔW holds NaN or inf values (or its norm overflows)")
    return _Module(B, A, float(f.scale), math.sqrt(max(norm_sq, 0.0)))


def _cosine(x: _Module, y: _Module) -> float:
    denom = x.norm * y.norm
    if denom <= 0.0:
        return 0.0
    inner = x.scale * y.scale * float(np.vdot(x.B.T @ y.B, x.A @ y.A.T))
    return max(-1.0, min(1.0, inner / denom))


def _prepared(adapter: Adapter, what: str) -> dict[str, _Module]:
    return {name: _module(f, f"{what}, module {name!r}") for name, f in as_adapter(adapter, what).items()}


def _require_same_shape(name: str, x: _Module, y: _Module) -> None:
    if x.shape != y.shape:
        raise IncompatibleAdapters(f"module {name!r}: ΔW shapes {x.shape} and {y.shape} differ")


def _mean_cosine(x: dict[str, _Module], y: dict[str, _Module]) -> float:
    total, shared = 0.0, 0
    for name, mx in x.items():
        my = y.get(name)
        if my is None:
            continue
        _require_same_shape(name, mx, my)
        total += _cosine(mx, my)
        shared += 1
    return total / shared if shared else 0.0


def lora_cosine(a: Adapter, b: Adapter) -> float:
    """K-Merge similarity: mean over shared modules of cos(flat(ΔW_a), flat(ΔW_b))."""
    return _mean_cosine(_prepared(a, "first adapter"), _prepared(b, "second adapter"))


class SimilarityIndex:
    """A pool of adapters prepared for repeated similarity queries.

    Holds numpy views of the members' factors (no copy) and their per-module norms, computed
    once per member; `add` and `remove` keep it in step with the pool, so an arrival costs one
    query, not a rebuild.
    """

    def __init__(self, pool: Mapping[Hashable, Adapter] | None = None):
        self._members: dict[Hashable, dict[str, _Module]] = {}
        for pool_id, adapter in (pool or {}).items():
            self.add(pool_id, adapter)

    @property
    def ids(self) -> list[Hashable]:
        return list(self._members)

    def add(self, pool_id: Hashable, adapter: Adapter) -> None:
        """Add (or replace) a member; the index keeps views of its factors, so do not mutate them."""
        self._members[pool_id] = _prepared(adapter, f"pool adapter {pool_id!r}")

    def remove(self, pool_id: Hashable) -> None:
        del self._members[pool_id]

    def cosines(self, new: Adapter) -> dict[Hashable, float]:
        """Similarity of `new` to every member (0 where nothing is shared), in pool order."""
        query = _prepared(new, "new adapter")
        return {pool_id: _mean_cosine(members, query) for pool_id, members in self._members.items()}

    def query(self, new: Adapter) -> list[tuple[Hashable, float]]:
        """Member ids with their similarity to `new`, most similar first (ties: pool order)."""
        sims = self.cosines(new)
        return sorted(sims.items(), key=lambda item: -item[1])


def rank_by_similarity(new: Adapter, pool: Mapping[Hashable, Adapter]) -> list[tuple[Hashable, float]]:
    """Rank a pool by K-Merge similarity to `new`: [(id, sim)], most similar first."""
    return SimilarityIndex(pool).query(new)
