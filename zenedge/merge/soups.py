"""Two spectral "soups", named apart because they are different operators.

`monosoup` — MonoSoup (arXiv:2602.09689; github.com/alirezaabdollahpour/MonoSoup, MonoSoup.py,
`_monosoup_update_for_layer` with version "freevariance"): a data-free edit of ONE
checkpoint. Per module, with ΔW = U diag(σ) Vᵀ (here: the thin SVD of s·B·A, via QR):

    p_i = σ_i / (Σσ + ε),  H = −Σ p_i log(p_i + ε),  k = clamp(⌈exp(H)⌉, 1, #σ)
    P_k = Σ_{i≤k} σ_i² / (Σσ² + ε),  ρ = (σ_{k+1} / (σ_1 + ε))²  (0 when k = #σ)
    λ_low = ρ + (1 − ρ)·sqrt(1 − P_k),  λ_high = 1 − λ_low   (both clamped to [0, 1])
    ΔW' = λ_high ΔW_high + λ_low ΔW_low       (top-k part and the rest)

with ε = 1e-12 as in MonoSoup.py, and a module whose Σσ² < ε left unchanged. MonoSoup takes
the SVD of the dense ΔW (min(out, in) values, the extra ones zero for a LoRA); the thin SVD
has only the nonzero ones, which changes nothing above: zeros add nothing to H or to the
energies, and ρ is 0 either way when k covers every nonzero σ (a test checks the two agree).

`svd_soup` — the seed design's "SVD soup": truncate each checkpoint's ΔW to rank `rank`, then
average over the checkpoints (a module an adapter lacks counts as zero there, as for any
average of task vectors). It spans several checkpoints and rescales nothing per direction;
it is not MonoSoup.

Both are re-factorised to the rank cap afterwards (energy reported), like every method.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from zenedge.merge.errors import InvalidMergeOption
from zenedge.merge.factors import Adapter, module_union
from zenedge.merge.product_svd import ThinSVD, factors_svd, product_svd, stack_products, truncate, truncate_all
from zenedge.merge.result import MergeResult, RankCap, merge_method, resolve_rank_cap

MONOSOUP_EPS = 1e-12  # MonoSoup.py's eps, kept for its edge cases (zero modules, σ_1 = 0)


def monosoup_spectrum(svd: ThinSVD) -> tuple[ThinSVD, dict[str, float]]:
    """MonoSoup's reweighting of one module's singular values, re-sorted descending."""
    s = svd.S
    energy = s.square()
    total_energy = float(energy.sum())
    if total_energy < MONOSOUP_EPS:
        return svd, {"k": 0, "p_k": 1.0, "rho": 0.0, "lambda_high": 1.0, "lambda_low": 1.0}
    probs = s / (s.sum() + MONOSOUP_EPS)
    entropy = float(-(probs * torch.log(probs + MONOSOUP_EPS)).sum())
    k = min(max(math.ceil(math.exp(entropy)), 1), s.numel())
    p_k = float(energy[:k].sum()) / (total_energy + MONOSOUP_EPS)
    rho = (float(s[k]) / (float(s[0]) + MONOSOUP_EPS)) ** 2 if k < s.numel() else 0.0
    lambda_low = rho + (1.0 - rho) * math.sqrt(min(max(1.0 - p_k, 0.0), 1.0))
    lambda_high = min(max(1.0 - lambda_low, 0.0), 1.0)
    lambda_low = min(max(lambda_low, 0.0), 1.0)
    weights = torch.full_like(s, lambda_low)
    weights[:k] = lambda_high
    edited = s * weights
    order = torch.argsort(edited, descending=True)
    out = ThinSVD(U=svd.U[:, order], S=edited[order], V=svd.V[:, order])
    return out, {"k": k, "p_k": p_k, "rho": rho, "lambda_high": lambda_high, "lambda_low": lambda_low}


@merge_method("monosoup", min_adapters=1, max_adapters=1)
def monosoup(adapters: Sequence[Adapter], *, max_rank: RankCap = "member") -> MergeResult:
    """MonoSoup's spectral edit of one adapter (per module), in low rank, rank-capped."""
    (adapter,) = adapters
    cap = resolve_rank_cap(max_rank, adapters)
    svds, per_module = {}, {}
    for name, f in adapter.items():
        svds[name], per_module[name] = monosoup_spectrum(factors_svd(f))
    factors, report = truncate_all(svds, cap)
    return MergeResult("monosoup", factors, report, {"modules": per_module})


@merge_method("svd-soup", min_adapters=1)
def svd_soup(
    adapters: Sequence[Adapter],
    *,
    rank: int | None = None,
    max_rank: RankCap = "member",
) -> MergeResult:
    """Mean over adapters of each ΔW truncated to `rank` (default: the cap), rank-capped."""
    cap = resolve_rank_cap(max_rank, adapters)
    if rank is None:
        rank = cap
    elif isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidMergeOption(f"svd-soup rank must be a positive int, got {rank!r}")
    share = 1.0 / len(adapters)
    svds = {}
    for name in module_union(adapters):
        terms = []
        for adapter in adapters:
            if name in adapter:
                part = truncate(factors_svd(adapter[name]), rank).factors  # balanced, scale 1
                terms.append((share * part.B, part.A))
        B, A = stack_products(terms)
        svds[name] = product_svd(B, A)
    factors, report = truncate_all(svds, cap)
    return MergeResult("svd-soup", factors, report, {"rank": rank})
