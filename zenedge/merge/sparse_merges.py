"""TIES and DARE in product space, re-factorised to a rank cap.

Semantics of PEFT's merge_utils (peft/utils/merge_utils.py), applied per module to the dense
products ΔW_i = s_i B_i A_i rather than to A and B separately (PEFT's `combination_type="ties"`
without "_svd", and K-Merge's TIES baseline, mix the factors; PEFT's "ties_svd" is what this
is, bar the balanced factor split):

* TIES:  keep each ΔW_i's top-k entries by |value|, k = int(density · numel) (density ≥ 1
  keeps all); elect a sign per entry from the pruned, UNweighted stack ("total": sign of the
  sum, "frequency": sign of the count of signs; a tie elects +); then the disjoint mean
  Σ_i w_i ΔW_i·[sign agrees] / max(1, #agreeing). Default weights 1 (the mean already
  averages), as K-Merge passes [1, 1].
* DARE:  keep each entry with probability `density`, divide survivors by density, then the
  weighted sum Σ_i w_i ΔW_i (PEFT's dare_linear). Default weights 1/k, so the result is an
  unbiased estimate of the plain mean (K-Merge passes [1, 1], which sums).
* DARE-TIES: DARE's random drop, then TIES' election and disjoint mean.

The random masks are seeded per (seed, module, adapter position) through a hash, so a
module's result does not depend on which other modules the adapters have or their order.

A module present in only some adapters is merged over those (PEFT skips adapters that lack a
module). These methods are elementwise, so each module costs one dense out×in matrix per
adapter: fine at smollm2's 576×1536, the reason they are baselines rather than the pool's path.
The merged ΔW is then truncated by SVD to the rank cap; the σ² kept is reported (TIES output
is far from low rank, so expect it to lose much more energy than OPCM or a linear mix).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from zenedge.merge.errors import InvalidMergeOption
from zenedge.merge.factors import Adapter, module_union, require_finite_tensor
from zenedge.merge.product_svd import dense_svd, truncate_all
from zenedge.merge.result import MergeResult, RankCap, merge_method, resolve_rank_cap

SignMethod = Literal["total", "frequency"]


def magnitude_prune(delta: Tensor, density: float) -> Tensor:
    """Zero all but the int(density·numel) largest-|x| entries (density ≥ 1: unchanged)."""
    if density >= 1.0:
        return delta.clone()
    k = int(density * delta.numel())
    mask = torch.zeros(delta.numel(), dtype=delta.dtype)
    mask[torch.topk(delta.abs().reshape(-1), k=k).indices] = 1
    return delta * mask.reshape(delta.shape)


def random_prune(delta: Tensor, density: float, generator: torch.Generator) -> Tensor:
    """Keep each entry with probability density and rescale by 1/density (DARE)."""
    if density >= 1.0:
        return delta.clone()
    keep = torch.bernoulli(torch.full_like(delta, density), generator=generator)
    return delta * keep / density


def elect_and_merge(stacked: Tensor, weights: Tensor, sign_method: SignMethod) -> Tensor:
    """TIES' sign election (on the unweighted stack) and disjoint weighted mean. stacked: [n, out, in]."""
    signs = stacked.sign()
    if sign_method == "total":
        magnitude = stacked.sum(dim=0)
    elif sign_method == "frequency":
        magnitude = signs.sum(dim=0)
    else:
        raise InvalidMergeOption(f"sign method must be 'total' or 'frequency', got {sign_method!r}")
    elected = torch.where(magnitude >= 0, 1.0, -1.0).to(stacked.dtype)
    agree = signs == elected
    weighted = stacked * weights.reshape(-1, 1, 1)
    return (weighted * agree).sum(dim=0) / agree.sum(dim=0).clamp_min(1)


def _module_generator(seed: int, module: str, position: int) -> torch.Generator:
    digest = hashlib.blake2b(f"{seed}/{module}/{position}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


def _check_density(density: float, *, allow_zero: bool) -> float:
    density = float(density)
    if not (0.0 <= density <= 1.0) or (density == 0.0 and not allow_zero):
        low = "[0, 1]" if allow_zero else "(0, 1]"
        raise InvalidMergeOption(f"density must be in {low}, got {density}")
    return density


def _weights(weights: Sequence[float] | None, count: int, default: float) -> list[float]:
    if weights is None:
        return [default] * count
    weights = [float(w) for w in weights]
    if len(weights) != count or not all(math.isfinite(w) for w in weights):
        raise InvalidMergeOption(f"need {count} finite weights, got {weights}")
    return weights


def _sparse_merge(
    method: str,
    adapters: Sequence[Adapter],
    *,
    weights: list[float],
    density: float,
    drop: Literal["magnitude", "random"],
    elect: SignMethod | None,
    seed: int,
    max_rank: RankCap,
) -> MergeResult:
    cap = resolve_rank_cap(max_rank, adapters)
    svds = {}
    for name in module_union(adapters):
        present = [(i, a[name]) for i, a in enumerate(adapters) if name in a]
        pruned = []
        for position, f in present:
            delta = f.delta()
            if drop == "magnitude":
                pruned.append(magnitude_prune(delta, density))
            else:
                pruned.append(random_prune(delta, density, _module_generator(seed, name, position)))
        stacked = torch.stack(pruned)  # [n, out, in]
        w = torch.tensor([weights[i] for i, _ in present], dtype=stacked.dtype)
        if elect is None:
            merged = (stacked * w.reshape(-1, 1, 1)).sum(dim=0)
        else:
            merged = elect_and_merge(stacked, w, elect)
        require_finite_tensor(merged, f"{method}: merged ΔW of module {name!r} (the inputs were finite: it overflowed)")
        svds[name] = dense_svd(merged)
    factors, report = truncate_all(svds, cap)
    details = {"weights": weights, "density": density, "sign_method": elect, "seed": seed if drop == "random" else None}
    return MergeResult(method, factors, report, details)


@merge_method("ties", min_adapters=1)
def ties_merge(
    adapters: Sequence[Adapter],
    *,
    density: float = 0.2,
    weights: Sequence[float] | None = None,
    sign_method: SignMethod = "total",
    max_rank: RankCap = "member",
) -> MergeResult:
    """TIES on ΔW = s·B·A per module (top-density trim, sign election, disjoint mean)."""
    return _sparse_merge(
        "ties", adapters, weights=_weights(weights, len(adapters), 1.0),
        density=_check_density(density, allow_zero=True), drop="magnitude", elect=sign_method,
        seed=0, max_rank=max_rank,
    )


@merge_method("dare", min_adapters=1)
def dare_merge(
    adapters: Sequence[Adapter],
    *,
    density: float = 0.5,
    weights: Sequence[float] | None = None,
    seed: int = 0,
    max_rank: RankCap = "member",
) -> MergeResult:
    """DARE (linear) on ΔW per module: seeded random drop, rescale by 1/density, weighted sum."""
    return _sparse_merge(
        "dare", adapters, weights=_weights(weights, len(adapters), 1.0 / len(adapters)),
        density=_check_density(density, allow_zero=False), drop="random", elect=None,
        seed=int(seed), max_rank=max_rank,
    )


@merge_method("dare-ties", min_adapters=1)
def dare_ties_merge(
    adapters: Sequence[Adapter],
    *,
    density: float = 0.5,
    weights: Sequence[float] | None = None,
    sign_method: SignMethod = "total",
    seed: int = 0,
    max_rank: RankCap = "member",
) -> MergeResult:
    """DARE's random drop, then TIES' sign election and disjoint mean, per module."""
    return _sparse_merge(
        "dare-ties", adapters, weights=_weights(weights, len(adapters), 1.0),
        density=_check_density(density, allow_zero=False), drop="random", elect=sign_method,
        seed=int(seed), max_rank=max_rank,
    )
