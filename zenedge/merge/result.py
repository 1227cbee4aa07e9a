"""What every merge method returns, and the checks every method runs on its way in and out.

A method takes `Sequence[Adapter]` (oldest first) plus keyword options and returns a
`MergeResult`: factors (scale 1, rank ≤ the cap) and a report. `merge_method` wraps each
method so that inputs must be finite and shape-compatible and outputs must be finite, with
errors that name the adapter and module; methods never write into their inputs.

Rank cap (`max_rank`): an int caps every module; "member" (the default, DESIGN.md's
`merge_rank = "member"`) caps at the largest rank any input has at any module, so a merge
frees the other members' bytes; None keeps every nonzero direction (exact, rank grows).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from zenedge.merge.errors import InvalidMergeOption, NonFiniteValues
from zenedge.merge.factors import Adapter, LoraFactors, as_adapter, require_finite_adapter, require_same_shapes
from zenedge.merge.product_svd import TruncationReport

RankCap = Union[int, Literal["member"], None]


@dataclass(frozen=True)
class MergeResult:
    method: str
    adapter: dict[str, LoraFactors]  # scale 1.0 everywhere
    truncation: TruncationReport  # ranks and σ² fraction kept by the final re-factorisation
    details: dict[str, Any] = field(default_factory=dict)  # method-specific numbers


def resolve_rank_cap(max_rank: RankCap, adapters: Sequence[Adapter]) -> int | None:
    if max_rank is None:
        return None
    if max_rank == "member":
        return max((f.rank for a in adapters for f in a.values()), default=1)
    if isinstance(max_rank, bool) or not isinstance(max_rank, int) or max_rank < 1:
        raise InvalidMergeOption(f"max_rank must be a positive int, 'member' or None, got {max_rank!r}")
    return max_rank


MergeFn = Callable[..., MergeResult]


def merge_method(name: str, *, min_adapters: int = 1, max_adapters: int | None = None) -> Callable[[MergeFn], MergeFn]:
    """Decorator: count, finiteness and shape checks around a merge method."""

    def wrap(fn: MergeFn) -> MergeFn:
        @functools.wraps(fn)
        def checked(adapters: Sequence[Adapter], **options: Any) -> MergeResult:
            adapters = [as_adapter(a, f"{name}: adapter {i}") for i, a in enumerate(adapters)]
            if len(adapters) < min_adapters or (max_adapters is not None and len(adapters) > max_adapters):
                if max_adapters == min_adapters:
                    wanted = f"exactly {min_adapters}"
                elif max_adapters is None:
                    wanted = f"at least {min_adapters}"
                else:
                    wanted = f"{min_adapters} to {max_adapters}"
                raise InvalidMergeOption(f"{name} takes {wanted} adapter(s), got {len(adapters)}")
            for i, adapter in enumerate(adapters):
                require_finite_adapter(adapter, f"{name}: adapter {i}")
            require_same_shapes(adapters)
            result = fn(adapters, **options)
            try:
                require_finite_adapter(result.adapter, f"{name}: result")
            except NonFiniteValues as err:
                raise NonFiniteValues(f"{err.message} (inputs were finite: the merge overflowed)") from None
            return result

        return checked

    return wrap
