"""Dense OPCM: continual model merging by orthogonal projection (arXiv:2501.09522).

Semantics of FusionBench's `OPCMForCLIP.run` (fusion_bench/method/opcm/opcm.py), on task
vectors given as `dict[str, Tensor]` (τ = W_task − W_base per parameter):

    first model:  Δ_1 = τ_1,  λ_1 = 1,  norms = [‖τ_1‖]
    step t:       a_t = mean(‖τ_1‖, …, ‖τ_t‖)      ‖τ‖ = norm of ALL entries flattened together
                  τ̃ = project(Δ_{t−1}, τ_t)        per 2-D entry (zenedge.merge.projection);
                                                    other entries: τ̃ = τ
                  Ŝ = λ_{t−1} Δ_{t−1} + τ̃
                  λ_t = ‖Ŝ‖ / a_t,  Δ_t = Ŝ / λ_t    (so ‖Δ_t‖ = a_t)

`OPCMState` is the resumable state (Δ, λ, the norms; count = len(norms)); `opcm_fold` is a
fold of `opcm_step` over `opcm_init`. Nothing is mutated: every step returns a new state.

Differences from FusionBench, each on purpose:
* "2-D entry" stands for FusionBench's "weight of an nn.Linear": a dict has no module types.
  Pass `is_projected` to restrict the projection (e.g. to exclude embedding tables, which
  FusionBench adds plainly).
* The diagonal rule only covers nonzero singular values (see projection.py).
* A key missing from one side counts as a zero tensor of the other side's shape (what the
  dense math gives for a zero entry), so adapters targeting different modules can be merged.
* All task vectors zero (a_t = 0) gives Δ_t = 0 and λ_t = 1 instead of 0/0.
* The thin SVD (full_matrices=False) replaces the full one; the result is the same (see
  projection.py), at a fraction of the cost for non-square matrices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from zenedge.merge.errors import IncompatibleAdapters, InvalidMergeOption
from zenedge.merge.factors import Adapter, compute_dtype, require_finite_tensor
from zenedge.merge.product_svd import dense_svd, nonzero_count, truncate_all
from zenedge.merge.projection import removed_couplings, require_alpha, split_rank
from zenedge.merge.result import MergeResult, RankCap, merge_method, resolve_rank_cap

TaskVector = Mapping[str, Tensor]
Projected = Callable[[str, Tensor], bool]


def project_2d(name: str, tensor: Tensor) -> bool:
    """Default rule: every 2-D entry is projected, everything else is added plainly."""
    return tensor.ndim == 2


@dataclass(frozen=True)
class OPCMState:
    """Resumable dense OPCM state after `count` task vectors."""

    merged: dict[str, Tensor]  # Δ_t, ‖Δ_t‖ = mean(norms)
    lam: float  # λ_t
    norms: tuple[float, ...]  # ‖τ_1‖ … ‖τ_t‖

    @property
    def count(self) -> int:
        return len(self.norms)


def task_vector_norm(tau: TaskVector) -> float:
    """‖τ‖ of the whole task vector: sqrt(Σ over entries of Σ x²)."""
    total = 0.0
    for t in tau.values():
        total += float(t.to(compute_dtype(t)).square().sum())
    return math.sqrt(total)


def _checked_copy(tau: TaskVector, what: str) -> dict[str, Tensor]:
    out = {}
    for name, t in tau.items():
        require_finite_tensor(t, f"{what}: entry {name!r}")
        out[name] = t.to(compute_dtype(t), copy=True)
    return out


def opcm_init(tau: TaskVector) -> OPCMState:
    """State after the first task vector: Δ_1 = τ_1 (a copy), λ_1 = 1."""
    merged = _checked_copy(tau, "task vector 1")
    return OPCMState(merged=merged, lam=1.0, norms=(task_vector_norm(merged),))


def project_dense(delta: Tensor, tau: Tensor, alpha: float) -> Tensor:
    """τ̃ = τ − U_p K V_pᵀ: τ without its couplings to Δ's top singular block and diagonal."""
    svd = dense_svd(delta)
    p = nonzero_count(svd.S)
    if p == 0:
        return tau.clone()
    U, s, V = svd.U[:, :p], svd.S[:p], svd.V[:, :p]
    coupling = U.T @ tau @ V  # [p, p]
    removed = removed_couplings(coupling, split_rank(s, alpha))
    return tau - U @ removed @ V.T


def opcm_step(
    state: OPCMState,
    tau: TaskVector,
    alpha: float = 0.5,
    *,
    is_projected: Projected = project_2d,
) -> OPCMState:
    """Merge one more task vector into `state`; returns the new state (inputs untouched)."""
    alpha = require_alpha(alpha)
    tau = _checked_copy(tau, f"task vector {state.count + 1}")
    norms = state.norms + (task_vector_norm(tau),)
    mean_norm = sum(norms) / len(norms)

    summed: dict[str, Tensor] = {}
    for name in list(state.merged) + [n for n in tau if n not in state.merged]:
        delta, task = _aligned(name, state.merged.get(name), tau.get(name))
        if is_projected(name, delta):
            task = project_dense(delta, task, alpha)
        summed[name] = state.lam * delta + task  # Ŝ

    summed_norm = task_vector_norm(summed)
    if mean_norm == 0.0 or summed_norm == 0.0:
        # Every task vector so far is zero: Ŝ = 0 too, and λ = ‖Ŝ‖/a_t would be 0/0.
        return OPCMState(merged=summed, lam=1.0, norms=norms)
    lam = summed_norm / mean_norm
    merged = {name: s / lam for name, s in summed.items()}
    return OPCMState(merged=merged, lam=lam, norms=norms)


def _aligned(name: str, delta: Tensor | None, task: Tensor | None) -> tuple[Tensor, Tensor]:
    """Both sides of one entry, a missing side as zeros, in one dtype; shapes must agree."""
    if delta is None:
        delta = torch.zeros_like(task)
    if task is None:
        task = torch.zeros_like(delta)
    if delta.shape != task.shape:
        raise IncompatibleAdapters(
            f"entry {name!r}: merged shape {tuple(delta.shape)}, task vector {tuple(task.shape)}"
        )
    dtype = compute_dtype(delta, task)
    return delta.to(dtype), task.to(dtype)


def opcm_fold(
    task_vectors: Sequence[TaskVector],
    alpha: float = 0.5,
    *,
    is_projected: Projected = project_2d,
) -> OPCMState:
    """Sequential OPCM over `task_vectors` in order; the final state (Δ_T in `merged`, ‖Δ_T‖ = mean ‖τ_i‖)
    can be continued later."""
    if not task_vectors:
        raise InvalidMergeOption("OPCM needs at least one task vector")
    require_alpha(alpha)
    state = opcm_init(task_vectors[0])
    for tau in task_vectors[1:]:
        state = opcm_step(state, tau, alpha, is_projected=is_projected)
    return state


@merge_method("opcm-dense", min_adapters=1)
def opcm_dense(adapters: Sequence[Adapter], *, alpha: float = 0.5, max_rank: RankCap = "member") -> MergeResult:
    """Dense OPCM on each adapter's ΔW = s·B·A, truncated to the cap once at the end."""
    alpha = require_alpha(alpha)
    cap = resolve_rank_cap(max_rank, adapters)
    task_vectors = [{name: f.delta() for name, f in adapter.items()} for adapter in adapters]
    state = opcm_fold(task_vectors, alpha)
    factors, report = truncate_all({name: dense_svd(d) for name, d in state.merged.items()}, cap)
    details = {"alpha": alpha, "lam": state.lam, "norms": list(state.norms)}
    return MergeResult("opcm-dense", factors, report, details)
