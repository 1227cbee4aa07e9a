"""Thin SVD of a low-rank product, and truncation back to LoRA factors with the energy kept.

For ΔW = B @ A with B: [out, k], A: [k, in] (k small), the SVD never needs ΔW:

    Q_B R_B = B        (reduced QR, Q_B: [out, k])
    Q_A R_A = Aᵀ       (reduced QR, Q_A: [in, k])
    R_B R_Aᵀ = Ũ diag(σ) Ṽᵀ      (a k×k SVD)
    ΔW = (Q_B Ũ) diag(σ) (Q_A Ṽ)ᵀ

Memory O((out+in)·k), time O((out+in)·k²). `truncate` keeps the top singular triplets up to a
rank cap and returns balanced factors B = U√σ, A = √σVᵀ with scale 1, plus the σ² fraction
kept. Singular values at or below `nonzero_tolerance(dtype)·σ_1` are rounding noise of an
exactly rank-deficient product and are always dropped (they also define "nonzero" for OPCM's
diagonal rule, in both the dense and the low-rank path).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from zenedge.merge.errors import InvalidMergeOption
from zenedge.merge.factors import LoraFactors, compute_dtype

# Relative cut between signal and rounding noise. Noise singular values of an exactly
# rank-deficient matrix sit near sqrt(dim)·eps·σ_1 (≈ 40·eps for 576×1536); 1000·eps clears
# that with margin in float32 (1.2e-4) and float64 (2.2e-13) while dropping at most
# (1e-4)² of the energy per discarded direction.
_NOISE_EPS_MULTIPLE = 1000.0


def nonzero_tolerance(dtype: torch.dtype) -> float:
    return _NOISE_EPS_MULTIPLE * torch.finfo(dtype).eps


def nonzero_count(S: Tensor) -> int:
    """How many singular values (descending) are above the noise cut relative to σ_1."""
    if S.numel() == 0 or float(S[0]) <= 0.0:
        return 0
    return int((S > nonzero_tolerance(S.dtype) * S[0]).sum())


@dataclass(frozen=True)
class ThinSVD:
    """ΔW = U diag(S) Vᵀ with U: [out, k], S: [k] descending, V: [in, k]."""

    U: Tensor
    S: Tensor
    V: Tensor


def product_svd(B: Tensor, A: Tensor, scale: float = 1.0) -> ThinSVD:
    """Thin SVD of scale·B@A via QR of the factors; never materialises out×in."""
    dtype = compute_dtype(A, B)
    q_b, r_b = torch.linalg.qr(B.to(dtype))  # [out, kb], [kb, k]
    q_a, r_a = torch.linalg.qr(A.to(dtype).T)  # [in, ka], [ka, k]
    core = scale * (r_b @ r_a.T)  # [kb, ka]
    u, s, vh = torch.linalg.svd(core, full_matrices=False)
    return ThinSVD(U=q_b @ u, S=s, V=q_a @ vh.T)


def factors_svd(f: LoraFactors) -> ThinSVD:
    return product_svd(f.B, f.A, f.scale)


def dense_svd(delta: Tensor) -> ThinSVD:
    """Thin SVD of a dense matrix, same form as product_svd (for the product-space methods)."""
    dtype = compute_dtype(delta)
    u, s, vh = torch.linalg.svd(delta.to(dtype), full_matrices=False)
    return ThinSVD(U=u, S=s, V=vh.T)


def stack_products(terms: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Σ_i B_i @ A_i as one product [B_1 … B_n] @ [A_1; …; A_n] (rank adds up)."""
    return torch.cat([b for b, _ in terms], dim=1), torch.cat([a for _, a in terms], dim=0)


@dataclass(frozen=True)
class TruncationReport:
    """What re-factorising to a rank cap kept: per module rank and σ² fraction, and overall.

    energy_kept[m] = Σ_kept σ² / Σ_all σ² for module m (1.0 for a zero module);
    energy_kept_overall = Σ_m kept / Σ_m all (energy-weighted, 1.0 when everything is zero).
    """

    ranks: dict[str, int] = field(default_factory=dict)
    energy_kept: dict[str, float] = field(default_factory=dict)
    energy_kept_overall: float = 1.0

    @property
    def max_rank(self) -> int:
        return max(self.ranks.values(), default=0)


@dataclass(frozen=True)
class Truncated:
    factors: LoraFactors
    kept_energy: float
    total_energy: float


def truncate(svd: ThinSVD, max_rank: int | None) -> Truncated:
    """Top singular triplets up to max_rank (None: no cap), noise dropped, as balanced factors.

    A zero ΔW comes back as one zero rank-1 pair rather than rank 0, so consumers that store
    PEFT files (r ≥ 1) never meet an empty factor.
    """
    if max_rank is not None and max_rank < 1:
        raise InvalidMergeOption(f"rank cap must be ≥ 1, got {max_rank}")
    keep = nonzero_count(svd.S)
    if max_rank is not None:
        keep = min(keep, max_rank)
    energy = svd.S.square()
    total = float(energy.sum())
    kept = float(energy[:keep].sum())
    if keep == 0:
        out_dim, in_dim = svd.U.shape[0], svd.V.shape[0]
        zeros = LoraFactors(svd.V.new_zeros(1, in_dim), svd.U.new_zeros(out_dim, 1), 1.0)
        return Truncated(zeros, kept_energy=0.0, total_energy=total)
    root = svd.S[:keep].sqrt()
    B = svd.U[:, :keep] * root  # [out, keep]
    A = (svd.V[:, :keep] * root).T.contiguous()  # [keep, in]
    return Truncated(LoraFactors(A, B, 1.0), kept_energy=kept, total_energy=total)


def truncate_all(svds: Mapping[str, ThinSVD], max_rank: int | None) -> tuple[dict[str, LoraFactors], TruncationReport]:
    """truncate() per module, and the report over all of them."""
    out: dict[str, LoraFactors] = {}
    ranks: dict[str, int] = {}
    fractions: dict[str, float] = {}
    kept_sum = total_sum = 0.0
    for name, svd in svds.items():
        t = truncate(svd, max_rank)
        out[name] = t.factors
        ranks[name] = t.factors.rank
        fractions[name] = energy_fraction(t.kept_energy, t.total_energy)
        kept_sum += t.kept_energy
        total_sum += t.total_energy
    report = TruncationReport(ranks, fractions, energy_fraction(kept_sum, total_sum))
    return out, report


def energy_fraction(kept: float, total: float) -> float:
    """kept/total clamped to [0, 1]; nothing to lose (total 0) counts as all kept."""
    if total <= 0.0:
        return 1.0
    return min(1.0, max(0.0, kept / total))
