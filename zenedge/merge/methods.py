"""The table of merge methods: name → function, and one entry point that dispatches on it.

Every method has the signature `fn(adapters, *, max_rank="member", **options) -> MergeResult`
(result.py): adapters oldest first, factors out (scale 1, rank ≤ cap) with a report. Inputs
and outputs are checked for finiteness by the `merge_method` wrapper; inputs are never
written to.

| name          | family                     | what it is                                            |
|---------------|----------------------------|-------------------------------------------------------|
| kmerge-linear | kmerge_linear.py           | K-Merge as published: PEFT "linear" in factor space   |
| ties          | sparse_merges.py           | TIES on B·A per module, SVD back to the cap           |
| dare          | sparse_merges.py           | DARE (linear) on B·A, seeded                          |
| dare-ties     | sparse_merges.py           | DARE drop + TIES election on B·A, seeded              |
| monosoup      | soups.py                   | MonoSoup spectral edit of ONE adapter                 |
| svd-soup      | soups.py                   | mean of rank-r truncated ΔW over adapters             |
| opcm          | lowrank_opcm.py            | sequential OPCM in product space, capped every step   |
| opcm-dense    | opcm.py                    | dense sequential OPCM on B·A, SVD to the cap at the end|
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zenedge.merge.errors import UnknownMergeMethod
from zenedge.merge.factors import Adapter
from zenedge.merge.kmerge_linear import kmerge_linear
from zenedge.merge.lowrank_opcm import lowrank_opcm_init, lowrank_opcm_step
from zenedge.merge.opcm import opcm_fold
from zenedge.merge.product_svd import dense_svd, truncate_all
from zenedge.merge.projection import require_alpha
from zenedge.merge.result import MergeFn, MergeResult, RankCap, merge_method, resolve_rank_cap
from zenedge.merge.soups import monosoup, svd_soup
from zenedge.merge.sparse_merges import dare_merge, dare_ties_merge, ties_merge


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


MERGE_METHODS: Mapping[str, MergeFn] = {
    "kmerge-linear": kmerge_linear,
    "ties": ties_merge,
    "dare": dare_merge,
    "dare-ties": dare_ties_merge,
    "monosoup": monosoup,
    "svd-soup": svd_soup,
    "opcm": opcm_lowrank,
    "opcm-dense": opcm_dense,
}


def merge(method: str, adapters: Sequence[Adapter], **options: Any) -> MergeResult:
    """Run the named method from MERGE_METHODS (options go to it as keywords)."""
    try:
        fn = MERGE_METHODS[method]
    except KeyError:
        known = ", ".join(sorted(MERGE_METHODS))
        raise UnknownMergeMethod(f"unknown merge method {method!r}", hint=f"known: {known}") from None
    return fn(adapters, **options)

