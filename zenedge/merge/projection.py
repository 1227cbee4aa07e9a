"""OPCM's projection rule, shared by the dense and the low-rank merge.

Given the merged update's SVD Δ = U diag(s) Vᵀ and a new task vector τ, FusionBench's OPCM
(fusion_bench/method/opcm/opcm.py, `merge_linear_weights`) computes, with FULL U and V,

    r = first index where cumsum(s)/sum(s) > α          (plain singular values, not σ²)
    P = Uᵀ τ V;  P[i, i] = 0 for all i;  P[:r, :r] = 0;  τ̃ = U P Vᵀ

Since only the zeroed entries change, τ̃ = τ − U_p K V_pᵀ, where K is the p×p matrix of the
removed couplings C = U_pᵀ τ V_p (the top-left r×r block and the diagonal beyond it). This
thin form is what both paths use; it never needs the full U, V.

What differs from FusionBench, on purpose:
* Diagonal couplings are zeroed only for NONZERO singular values (s_i above the noise cut of
  product_svd.nonzero_tolerance). When Δ is rank-deficient, FusionBench's full SVD pads U, V
  with arbitrary orthonormal directions and zeroes τ's couplings along those too, which
  depends on the LAPACK build; the low-rank path cannot even see them. For a full-rank Δ the
  two agree exactly (a test checks the thin form against the literal full-matrix code).
* FusionBench zeroes the diagonal with `.diagonal().fill_(0)`. Before 2025-03-18 it used
  `.diag().fill_(0)`, which fills a copy (a no-op); K-Merge's vendored copy still does. We
  implement the fixed behaviour, which is what makes τ̃ exactly Frobenius-orthogonal to Δ:
  ⟨Δ, τ̃⟩ = Σ_i s_i (Uᵀτ̃V)_ii = 0 because every diagonal entry of Uᵀτ̃V with s_i > 0 is zero.
* An all-zero s (Δ = 0) gives r = 0 instead of FusionBench's NaN comparison (whose argmax
  also happens to be 0), and α must lie in [0, 1): α ≥ 1 never crosses and would silently
  mean r = 0.
"""

from __future__ import annotations

from torch import Tensor

from zenedge.merge.errors import InvalidMergeOption


def require_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 <= alpha < 1.0:
        raise InvalidMergeOption(f"OPCM alpha must be in [0, 1), got {alpha}")
    return alpha


def split_rank(s: Tensor, alpha: float) -> int:
    """First index i where cumsum(s)[i] / sum(s) > alpha (0 when s sums to 0)."""
    total = float(s.sum())
    if total <= 0.0:
        return 0
    crossed = (s.cumsum(dim=0) / total) > alpha
    if not bool(crossed.any()):  # only rounding can get here, since the last ratio is 1 > α
        return int(s.numel())
    return int(crossed.float().argmax())


def removed_couplings(coupling: Tensor, r: int) -> Tensor:
    """K: the entries of C = U_pᵀ τ V_p that OPCM zeroes (top-left r×r block + diagonal)."""
    removed = coupling.diag().diag_embed()  # [p, p], the whole diagonal
    removed[:r, :r] = coupling[:r, :r]
    return removed
