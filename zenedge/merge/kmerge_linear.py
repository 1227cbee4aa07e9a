"""K-Merge's merge as published: PEFT's `add_weighted_adapter(combination_type="linear")`.

K-Merge (github.com/donaldssh/K-Merge, merge.py) merges a new LoRA into a slot with n members
(after adding) through PEFT with weights [1 − 1/n, 1/n] (`running_average_weights`). PEFT's
"linear" (peft/tuners/lora/model.py, `_generalized_task_arithmetic_weighted_adapter`) mixes
the FACTORS, not the products. With w_i' = w_i · scaling_i (scaling = lora_alpha / r):

    A = Σ_i sign(w_i') · sqrt(|w_i'|) · A_i        (the sign goes on A only)
    B = Σ_i            sqrt(|w_i'|) · B_i
    scaling of the result = 1                     (PEFT sets lora_alpha = r)

so ΔW = B A = Σ_i Σ_j sqrt(|w_i'| |w_j'|) sign(w_j') B_i A_j: besides the intended
Σ_i w_i' B_i A_i it gains cross terms B_i A_j (i ≠ j), which are noise unless the adapters
share a basis. This is the published baseline our product-space merges are meant to beat.

As in PEFT: all members of a module must have the same rank (the result keeps it); an
adapter that lacks a module simply does not contribute there (no renormalisation); weights
default to equal (1/k each), which for two adapters is K-Merge's first merge (n = 2);
`members_after=n` gives K-Merge's running average for [slot, new].

Beyond PEFT: if the common rank exceeds the rank cap, the factor-space result is truncated by
SVD of its product (reported); otherwise the factors are returned as PEFT computes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from zenedge.merge.errors import IncompatibleAdapters, InvalidMergeOption
from zenedge.merge.factors import Adapter, LoraFactors, compute_dtype, factor_norm_sq, module_union
from zenedge.merge.product_svd import TruncationReport, energy_fraction, factors_svd, truncate
from zenedge.merge.result import MergeResult, RankCap, merge_method, resolve_rank_cap


def running_average_weights(members_after: int) -> tuple[float, float]:
    """K-Merge's history-aware weights for (slot, new) when the slot will hold n members."""
    if members_after < 1:
        raise InvalidMergeOption(f"members_after must be ≥ 1, got {members_after}")
    return (1.0 - 1.0 / members_after, 1.0 / members_after)


def _weights(weights: Sequence[float] | None, count: int) -> list[float]:
    if weights is None:
        return [1.0 / count] * count
    weights = [float(w) for w in weights]
    if len(weights) != count or not all(math.isfinite(w) for w in weights):
        raise InvalidMergeOption(f"need {count} finite weights, got {weights}")
    return weights


def linear_factor_mix(members: Sequence[tuple[float, LoraFactors]]) -> LoraFactors:
    """PEFT's "linear" combination of one module's factors (see the module docstring)."""
    ranks = {f.rank for _, f in members}
    if len(ranks) != 1:
        raise IncompatibleAdapters(f"factor-space linear merge needs one rank per module, got ranks {sorted(ranks)}")
    dtype = compute_dtype(*(t for _, f in members for t in (f.A, f.B)))
    A = B = None
    for weight, f in members:
        scaled = weight * f.scale
        root = math.sqrt(abs(scaled))
        sign = 1.0 if scaled >= 0 else -1.0
        term_A = (sign * root) * f.A.to(dtype)
        term_B = root * f.B.to(dtype)
        A = term_A if A is None else A + term_A
        B = term_B if B is None else B + term_B
    return LoraFactors(A, B, 1.0)


@merge_method("kmerge-linear", min_adapters=1)
def kmerge_linear(
    adapters: Sequence[Adapter],
    *,
    weights: Sequence[float] | None = None,
    members_after: int | None = None,
    max_rank: RankCap = "member",
) -> MergeResult:
    """K-Merge/PEFT "linear" merge in factor space (cross terms included), rank-capped.

    `members_after=n` with adapters [slot, new] uses K-Merge's weights [1 − 1/n, 1/n].
    """
    if members_after is not None:
        if weights is not None or len(adapters) != 2:
            raise InvalidMergeOption("members_after takes exactly [slot, new] and no explicit weights")
        weights = running_average_weights(members_after)
    weights = _weights(weights, len(adapters))
    cap = resolve_rank_cap(max_rank, adapters)
    merged: dict[str, LoraFactors] = {}
    ranks: dict[str, int] = {}
    energy: dict[str, float] = {}
    kept_sum = total_sum = 0.0
    for name in module_union(adapters):
        members = [(w, a[name]) for w, a in zip(weights, adapters) if name in a]
        try:
            mixed = linear_factor_mix(members)
        except IncompatibleAdapters as err:
            raise IncompatibleAdapters(f"module {name!r}: {err.message}") from None
        if cap is not None and mixed.rank > cap:
            cut = truncate(factors_svd(mixed), cap)
            mixed, kept, total = cut.factors, cut.kept_energy, cut.total_energy
        else:
            kept = total = float(factor_norm_sq(mixed))
        merged[name] = mixed
        ranks[name] = mixed.rank
        energy[name] = energy_fraction(kept, total)
        kept_sum += kept
        total_sum += total
    report = TruncationReport(ranks, energy, energy_fraction(kept_sum, total_sum))
    return MergeResult("kmerge-linear", merged, report, {"weights": weights})
