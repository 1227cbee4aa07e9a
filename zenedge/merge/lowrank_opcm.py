"""Low-rank OPCM in product space: the pool's merge, never an out×in matrix.

Task vectors are LoRA adapters: per module τ = s·B_τ A_τ. The state keeps the merged update
as factors. One step, per module, with Δ_{t−1} = U diag(s) Vᵀ from `product_svd` (QR of the
factors, an SVD of the small core) and p = its number of nonzero singular values:

    C  = U_pᵀ τ V_p = (U_pᵀ s·B_τ)(A_τ V_p)                        [p, p]
    K  = removed_couplings(C, r),  r = split_rank(s_p, α)         (projection.py)
    τ̃  = τ − U_p K V_pᵀ = [s·B_τ, −U_p K] @ [A_τ; V_pᵀ]              (`projected_update`)
    Ŝ  = λ_{t−1} Δ_{t−1} + τ̃ = [λ_{t−1} U_p diag(s_p), s·B_τ, −U_p K] @ [V_pᵀ; A_τ; V_pᵀ]

so Ŝ has rank ≤ p + rank(τ) (the stacked factors repeat V_p; the QR absorbs that), and
memory stays O((out + in)·(2p + rank(τ))). Its thin SVD (again via QR) gives ‖Ŝ_m‖² = Σσ²,
hence λ_t = sqrt(Σ_m ‖Ŝ_m‖²)/a_t exactly as the dense path; Δ_t = Ŝ/λ_t is then re-factorised by
truncated SVD to rank ≤ max_rank (None: keep every nonzero direction, which equals the dense
path up to rounding). The σ² fraction kept is reported per module and overall.

Task-vector norms are taken in low rank, ‖τ‖² = Σ_m s² · sum((BᵀB) ⊙ (AAᵀ)).

Differences from dense OPCM (opcm.py), beyond representation:
* With a rank cap, Δ_t is the best rank-k approximation of Ŝ/λ_t, so ‖Δ_t‖ = a_t·sqrt(energy
  kept) < a_t, and the next step projects against that truncated Δ. λ_t is the exact one.
* Δ_{t−1}'s directions below the noise cut are dropped before they are scaled by λ, which the
  dense path keeps; they hold ≤ (1000·eps)² of the energy.
The state, like the dense one, is immutable: each step returns a new one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from zenedge.merge.errors import IncompatibleAdapters, InvalidMergeOption
from zenedge.merge.factors import (
    Adapter,
    LoraFactors,
    adapter_norm,
    as_adapter,
    compute_dtype,
    module_union,
    require_finite_adapter,
)
from zenedge.merge.product_svd import (
    ThinSVD,
    TruncationReport,
    factors_svd,
    nonzero_count,
    product_svd,
    truncate_all,
)
from zenedge.merge.projection import removed_couplings, require_alpha, split_rank
from zenedge.merge.result import MergeResult, RankCap, merge_method, resolve_rank_cap


@dataclass(frozen=True)
class LowRankOPCMState:
    """Resumable low-rank OPCM state: Δ_t as factors (scale 1), λ_t, the task-vector norms."""

    merged: dict[str, LoraFactors]
    lam: float
    norms: tuple[float, ...]
    truncation: TruncationReport = field(default_factory=TruncationReport)  # of the last step

    @property
    def count(self) -> int:
        return len(self.norms)


def lowrank_opcm_init(tau: Adapter, max_rank: int | None = None) -> LowRankOPCMState:
    """Δ_1 = τ_1 (re-factorised, balanced, capped at max_rank), λ_1 = 1."""
    tau = as_adapter(tau, "task vector 1")
    require_finite_adapter(tau, "task vector 1")
    merged, report = truncate_all({name: factors_svd(f) for name, f in tau.items()}, max_rank)
    return LowRankOPCMState(merged=merged, lam=1.0, norms=(adapter_norm(tau),), truncation=report)


def projected_update(delta: ThinSVD, tau: LoraFactors, alpha: float) -> LoraFactors:
    """τ̃ = τ − U_p K V_pᵀ as factors [s·B_τ, −U_p K] @ [A_τ; V_pᵀ] (rank ≤ rank(τ) + p).

    `delta` is Δ_{t−1}'s thin SVD; only its p nonzero directions are used.
    """
    p = nonzero_count(delta.S)
    dtype = compute_dtype(delta.U, tau.A, tau.B)
    U, s, V = delta.U[:, :p].to(dtype), delta.S[:p].to(dtype), delta.V[:, :p].to(dtype)
    B_tau, A_tau = tau.scaled_B().to(dtype), tau.A.to(dtype)  # τ = B_tau @ A_tau
    coupling = (U.T @ B_tau) @ (A_tau @ V)  # [p, p], never out×in
    removed = removed_couplings(coupling, split_rank(s, alpha))
    return LoraFactors(torch.cat([A_tau, V.T], dim=0), torch.cat([B_tau, -(U @ removed)], dim=1), 1.0)


def _summed_module(delta: LoraFactors | None, tau: LoraFactors | None, lam: float, alpha: float) -> ThinSVD:
    """SVD of Ŝ = λΔ + τ̃ for one module, from factors only."""
    if delta is None:  # nothing merged here yet: nothing to project against
        return factors_svd(tau)
    svd = factors_svd(delta)
    p = nonzero_count(svd.S)
    U, s, V = svd.U[:, :p], svd.S[:p], svd.V[:, :p]
    if tau is None:
        return ThinSVD(U=U, S=lam * s, V=V)
    if tau.shape != delta.shape:
        raise IncompatibleAdapters(f"merged ΔW shape {delta.shape}, task vector {tau.shape}")
    update = projected_update(svd, tau, alpha)
    dtype = update.A.dtype
    # Ŝ = [λ U_p diag(s_p), B̃] @ [V_pᵀ; Ã]; the QR inside product_svd absorbs the repeated V_p.
    B = torch.cat([U.to(dtype) * (lam * s.to(dtype)), update.B], dim=1)
    A = torch.cat([V.T.to(dtype), update.A], dim=0)
    return product_svd(B, A)


def lowrank_opcm_step(
    state: LowRankOPCMState,
    tau: Adapter,
    alpha: float = 0.5,
    max_rank: int | None = None,
) -> LowRankOPCMState:
    """Merge one more adapter into `state`; returns the new state (inputs untouched)."""
    alpha = require_alpha(alpha)
    tau = as_adapter(tau, f"task vector {state.count + 1}")
    require_finite_adapter(tau, f"task vector {state.count + 1}")
    norms = state.norms + (adapter_norm(tau),)
    mean_norm = sum(norms) / len(norms)

    summed = {
        name: _summed_module(state.merged.get(name), tau.get(name), state.lam, alpha)
        for name in module_union([state.merged, tau])
    }
    summed_norm = math.sqrt(sum(float(svd.S.square().sum()) for svd in summed.values()))
    if mean_norm == 0.0 or summed_norm == 0.0:
        lam = 1.0  # every task vector so far is zero (see opcm.py)
    else:
        lam = summed_norm / mean_norm
        summed = {name: ThinSVD(svd.U, svd.S / lam, svd.V) for name, svd in summed.items()}
    merged, report = truncate_all(summed, max_rank)
    return LowRankOPCMState(merged=merged, lam=lam, norms=norms, truncation=report)


def lowrank_opcm_fold(
    adapters: Sequence[Adapter],
    alpha: float = 0.5,
    max_rank: int | None = None,
) -> LowRankOPCMState:
    """Sequential low-rank OPCM over `adapters` in order; returns the final state."""
    if not adapters:
        raise InvalidMergeOption("OPCM needs at least one task vector")
    require_alpha(alpha)
    state = lowrank_opcm_init(adapters[0], max_rank)
    for tau in adapters[1:]:
        state = lowrank_opcm_step(state, tau, alpha, max_rank)
    return state


@merge_method("opcm", min_adapters=1)
def opcm_lowrank(adapters: Sequence[Adapter], *, alpha: float = 0.5, max_rank: RankCap = "member") -> MergeResult:
    """Low-rank OPCM over the adapters in order, truncated to the cap after every step."""
    alpha = require_alpha(alpha)
    cap = resolve_rank_cap(max_rank, adapters)
    state = lowrank_opcm_init(adapters[0], cap)
    energy_per_step = [state.truncation.energy_kept_overall]
    for tau in adapters[1:]:
        state = lowrank_opcm_step(state, tau, alpha, cap)
        energy_per_step.append(state.truncation.energy_kept_overall)
    details = {"alpha": alpha, "lam": state.lam, "norms": list(state.norms), "energy_kept_per_step": energy_per_step}
    return MergeResult("opcm", state.merged, state.truncation, details)
