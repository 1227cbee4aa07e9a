"""The table of merge methods: name → the function that runs it, and one entry point that dispatches on it.

Every method has the signature `fn(adapters, *, max_rank="member", **options) -> MergeResult`
(result.py): adapters oldest first, factors out (scale 1, rank ≤ cap) with a report. Inputs
and outputs are checked for finiteness by the `merge_method` wrapper; inputs are never
written to. The table names each function by its module, imported when the method runs, so
the CLI offers the names (`zenedge merge --method`) without loading torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zenedge.merge.errors import UnknownMergeMethod

if TYPE_CHECKING:
    from zenedge.merge.factors import Adapter
    from zenedge.merge.result import MergeFn, MergeResult

# name → (module in zenedge.merge, function); `zenedge merge --help` lists them in this order
MERGE_METHODS: Mapping[str, tuple[str, str]] = {
    "opcm": ("lowrank_opcm", "opcm_lowrank"),            # sequential OPCM in product space, capped every step
    "opcm-dense": ("opcm", "opcm_dense"),                # dense sequential OPCM on B·A, SVD to the cap at the end
    "kmerge-linear": ("kmerge_linear", "kmerge_linear"), # K-Merge as published: PEFT "linear" in factor space
    "ties": ("sparse_merges", "ties_merge"),             # TIES on B·A per module, SVD back to the cap
    "dare": ("sparse_merges", "dare_merge"),             # DARE (linear) on B·A, seeded
    "dare-ties": ("sparse_merges", "dare_ties_merge"),   # DARE drop + TIES election on B·A, seeded
    "monosoup": ("soups", "monosoup"),                   # MonoSoup spectral edit of ONE adapter
    "svd-soup": ("soups", "svd_soup"),                   # mean of rank-r truncated ΔW over adapters
}


def find_method(method: str) -> MergeFn:
    """The function behind the merge method called `method`."""
    try:
        module, function = MERGE_METHODS[method]
    except KeyError:
        known = ", ".join(sorted(MERGE_METHODS))
        raise UnknownMergeMethod(f"unknown merge method {method!r}", hint=f"known: {known}") from None
    return getattr(importlib.import_module(f"zenedge.merge.{module}"), function)


def merge(method: str, adapters: Sequence[Adapter], **options: Any) -> MergeResult:
    """Run the named method from MERGE_METHODS (options go to it as keywords)."""
    return find_method(method)(adapters, **options)
