import math

import pytest
import torch
from hypothesis import given, settings

from zenedge.merge.errors import IncompatibleAdapters, InvalidMergeOption, NonFiniteValues
from zenedge.merge.factors import LoraFactors, adapter_norm, factor_inner, factor_norm_sq, require_finite_adapter
from zenedge.merge.product_svd import factors_svd, nonzero_count, truncate, truncate_all

from .helpers import random_adapter, random_factors, ranks, scales, seeds


def test_factors_reject_mismatched_rank():
    with pytest.raises(IncompatibleAdapters, match="rank mismatch"):
        LoraFactors(torch.zeros(2, 5), torch.zeros(4, 3))


def test_factors_reject_non_finite_scale():
    with pytest.raises(NonFiniteValues):
        LoraFactors(torch.zeros(2, 5), torch.zeros(4, 2), float("nan"))


def test_require_finite_names_the_module():
    adapter = random_adapter(0)
    adapter["k_proj"].B[0, 0] = float("inf")
    with pytest.raises(NonFiniteValues, match="k_proj"):
        require_finite_adapter(adapter, "adapter")


@settings(max_examples=40, deadline=None)
@given(seed=seeds, r1=ranks, r2=ranks, s1=scales, s2=scales)
def test_low_rank_inner_product_equals_dense(seed, r1, r2, s1, s2):
    gen = torch.Generator().manual_seed(seed)
    x = random_factors(gen, (7, 5), r1, s1)
    y = random_factors(gen, (7, 5), r2, s2)
    assert float(factor_inner(x, y)) == pytest.approx(float((x.delta() * y.delta()).sum()), rel=1e-12, abs=1e-12)
    assert float(factor_norm_sq(x)) == pytest.approx(float(x.delta().square().sum()), rel=1e-12)


def test_adapter_norm_is_norm_of_everything_flattened():
    adapter = random_adapter(3)
    flat = torch.cat([f.delta().reshape(-1) for f in adapter.values()])
    assert adapter_norm(adapter) == pytest.approx(float(flat.norm()), rel=1e-12)


def test_padding_keeps_the_product():
    f = random_factors(torch.Generator().manual_seed(1), (4, 6), 2, 0.7)
    padded = f.padded(5)
    assert padded.rank == 5
    torch.testing.assert_close(padded.delta(), f.delta())


@settings(max_examples=40, deadline=None)
@given(seed=seeds, rank=ranks, scale=scales)
def test_product_svd_matches_dense_svd(seed, rank, scale):
    f = random_factors(torch.Generator().manual_seed(seed), (8, 5), rank, scale)
    svd = factors_svd(f)
    dense_s = torch.linalg.svdvals(f.delta())
    torch.testing.assert_close(svd.S, dense_s[: svd.S.numel()], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(svd.U @ torch.diag(svd.S) @ svd.V.T, f.delta(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(svd.U.T @ svd.U, torch.eye(svd.S.numel(), dtype=torch.float64), atol=1e-10, rtol=0)


def test_rank_deficient_product_has_noise_directions_dropped():
    gen = torch.Generator().manual_seed(2)
    B = torch.randn(9, 1, generator=gen, dtype=torch.float64)
    B = torch.cat([B, 2 * B, -B], dim=1)  # rank 1 spread over 3 columns
    f = LoraFactors(torch.randn(3, 7, generator=gen, dtype=torch.float64), B)
    svd = factors_svd(f)
    assert nonzero_count(svd.S) == 1
    cut = truncate(svd, None)
    assert cut.factors.rank == 1
    torch.testing.assert_close(cut.factors.delta(), f.delta(), rtol=1e-10, atol=1e-10)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, cap=ranks)
def test_truncation_honours_cap_and_reports_energy(seed, cap):
    adapter = random_adapter(seed, rank=3)
    factors, report = truncate_all({n: factors_svd(f) for n, f in adapter.items()}, cap)
    for name, f in factors.items():
        assert f.rank <= cap
        assert f.scale == 1.0
        assert 0.0 <= report.energy_kept[name] <= 1.0
        s = torch.linalg.svdvals(adapter[name].delta())
        expected = float(s[:cap].square().sum() / s.square().sum())
        assert report.energy_kept[name] == pytest.approx(expected, rel=1e-9)
        # Best rank-cap approximation: the residual holds exactly the dropped energy.
        residual = float((adapter[name].delta() - f.delta()).square().sum())
        assert residual == pytest.approx(float(s[cap:].square().sum()), rel=1e-8, abs=1e-10)
    assert 0.0 <= report.energy_kept_overall <= 1.0


def test_truncating_a_zero_update_gives_a_zero_rank_one_pair():
    f = LoraFactors(torch.randn(2, 5, dtype=torch.float64), torch.zeros(4, 2, dtype=torch.float64))
    cut = truncate(factors_svd(f), 2)
    assert cut.factors.rank == 1
    assert float(cut.factors.delta().abs().max()) == 0.0
    factors, report = truncate_all({"m": factors_svd(f)}, 2)
    assert report.energy_kept["m"] == 1.0 and not math.isnan(report.energy_kept_overall)


def test_rank_cap_must_be_positive():
    with pytest.raises(InvalidMergeOption):
        truncate(factors_svd(random_factors(torch.Generator().manual_seed(0), (3, 3), 1)), 0)
