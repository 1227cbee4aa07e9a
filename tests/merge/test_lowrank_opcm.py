import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zenedge.merge.errors import IncompatibleAdapters, InvalidMergeOption, NonFiniteValues
from zenedge.merge.factors import LoraFactors, adapter_norm, factor_inner, factor_norm_sq
from zenedge.merge.lowrank_opcm import (
    lowrank_opcm_fold,
    lowrank_opcm_init,
    lowrank_opcm_step,
    projected_update,
)
from zenedge.merge.opcm import OPCMState, opcm_fold, opcm_step, project_dense, task_vector_norm
from zenedge.merge.product_svd import dense_svd, factors_svd, truncate_all

from .helpers import dense, random_adapter, random_factors, ranks, scales, seeds, snapshot, unchanged

alphas = st.floats(min_value=0.0, max_value=0.95)


def assert_matches_dense(lowrank_merged, dense_merged, tol=1e-9):
    assert set(lowrank_merged) == set(dense_merged)
    for name, f in lowrank_merged.items():
        diff = float((f.delta() - dense_merged[name]).abs().max())
        assert diff <= tol * max(1.0, float(dense_merged[name].abs().max())), (name, diff)


@settings(max_examples=25, deadline=None)
@given(seeds_=st.lists(seeds, min_size=2, max_size=3), rank_list=st.lists(ranks, min_size=3, max_size=3),
       scale=scales, alpha=alphas)
def test_lowrank_equals_dense_without_truncation(seeds_, rank_list, scale, alpha):
    adapters = [random_adapter(s, r, scale) for s, r in zip(seeds_, rank_list)]
    state = lowrank_opcm_fold(adapters, alpha, max_rank=None)
    reference = opcm_fold([dense(a) for a in adapters], alpha)
    assert state.lam == pytest.approx(reference.lam, rel=1e-10)
    assert state.norms == pytest.approx(reference.norms, rel=1e-12)
    assert_matches_dense(state.merged, reference.merged)
    assert state.truncation.energy_kept_overall == pytest.approx(1.0, abs=1e-12)


def test_three_way_sequential_merge_agrees_at_every_step():
    adapters = [random_adapter(100 + i, rank=2 + i % 2, scale=0.25 * (i + 1)) for i in range(3)]
    low = lowrank_opcm_init(adapters[0])
    high = OPCMState(merged=dense(adapters[0]), lam=1.0, norms=(adapter_norm(adapters[0]),))
    for tau in adapters[1:]:
        low = lowrank_opcm_step(low, tau, 0.5)
        high = opcm_step(high, dense(tau), 0.5)
        assert low.lam == pytest.approx(high.lam, rel=1e-10)
        assert_matches_dense(low.merged, high.merged)
        mean = sum(low.norms) / low.count
        assert adapter_norm(low.merged) == pytest.approx(mean, rel=1e-10)
        assert task_vector_norm(high.merged) == pytest.approx(mean, rel=1e-10)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, rank_delta=st.integers(1, 4), rank_tau=ranks, alpha=alphas)
def test_projected_update_is_orthogonal_to_merge_and_equals_dense_projection(seed, rank_delta, rank_tau, alpha):
    gen = torch.Generator().manual_seed(seed)
    for shape in ((6, 6), (3, 8), (9, 4)):
        delta = random_factors(gen, shape, rank_delta, 1.3)
        tau = random_factors(gen, shape, rank_tau, 0.7)
        update = projected_update(factors_svd(delta), tau, alpha)
        assert update.rank <= rank_tau + min(rank_delta, *shape)
        scale = math.sqrt(float(factor_norm_sq(delta)) * float(factor_norm_sq(tau)))
        assert abs(float(factor_inner(update, delta))) <= 1e-10 * scale
        torch.testing.assert_close(update.delta(), project_dense(delta.delta(), tau.delta(), alpha), rtol=1e-9, atol=1e-9)


@settings(max_examples=20, deadline=None)
@given(seed=seeds, cap=st.integers(1, 4), alpha=alphas)
def test_rank_cap_is_honoured_and_equals_truncating_the_dense_step(seed, cap, alpha):
    first, second = random_adapter(seed, rank=3), random_adapter(seed + 1, rank=3)
    state = lowrank_opcm_init(first, max_rank=cap)
    stepped = lowrank_opcm_step(state, second, alpha, max_rank=cap)
    for report in (state.truncation, stepped.truncation):
        assert report.max_rank <= cap
        assert all(0.0 <= e <= 1.0 for e in report.energy_kept.values())
        assert 0.0 <= report.energy_kept_overall <= 1.0
    assert all(f.rank <= cap for f in stepped.merged.values())
    # Reference: a dense step from the (already truncated) merged state, then the same cap.
    dense_state = OPCMState(merged=dense(state.merged), lam=state.lam, norms=state.norms)
    dense_next = opcm_step(dense_state, dense(second), alpha)
    expected, expected_report = truncate_all({n: dense_svd(d) for n, d in dense_next.merged.items()}, cap)
    assert stepped.lam == pytest.approx(dense_next.lam, rel=1e-9)
    assert stepped.truncation.energy_kept_overall == pytest.approx(expected_report.energy_kept_overall, rel=1e-8)
    for name in expected:
        torch.testing.assert_close(stepped.merged[name].delta(), expected[name].delta(), rtol=1e-7, atol=1e-8)


def test_truncation_lowers_the_merged_norm_by_the_energy_kept():
    a, b = random_adapter(7, rank=3), random_adapter(8, rank=3)
    state = lowrank_opcm_fold([a, b], 0.5, max_rank=2)
    mean = sum(state.norms) / 2
    kept = state.truncation.energy_kept_overall
    assert kept < 1.0
    assert adapter_norm(state.merged) == pytest.approx(mean * math.sqrt(kept), rel=1e-9)


def test_resume_equals_one_pass_and_states_are_not_written():
    adapters = [random_adapter(50 + i) for i in range(4)]
    before = [snapshot(a) for a in adapters]
    one_pass = lowrank_opcm_fold(adapters, 0.5, max_rank=3)
    partial = lowrank_opcm_fold(adapters[:2], 0.5, max_rank=3)
    partial_snapshot = snapshot(partial.merged)
    resumed = partial
    for tau in adapters[2:]:
        resumed = lowrank_opcm_step(resumed, tau, 0.5, max_rank=3)
    assert unchanged(partial.merged, partial_snapshot)
    assert all(unchanged(a, s) for a, s in zip(adapters, before))
    assert resumed.lam == pytest.approx(one_pass.lam)
    for name, f in one_pass.merged.items():
        torch.testing.assert_close(resumed.merged[name].delta(), f.delta())


def test_modules_missing_from_one_side_match_the_dense_path():
    a = random_adapter(60)
    b = {k: v for k, v in random_adapter(61).items() if k != "k_proj"}
    c = {"k_proj": random_adapter(62)["k_proj"]}
    state = lowrank_opcm_fold([b, a, c], 0.5, max_rank=None)
    reference = opcm_fold([dense(b), dense(a), dense(c)], 0.5)
    assert_matches_dense(state.merged, reference.merged)


def test_zero_adapters_give_zero_not_nan():
    zero = {k: LoraFactors(f.A, torch.zeros_like(f.B), f.scale) for k, f in random_adapter(70).items()}
    state = lowrank_opcm_fold([zero, zero], 0.5, max_rank=2)
    assert state.lam == 1.0
    assert all(float(f.delta().abs().max()) == 0.0 for f in state.merged.values())
    assert state.truncation.energy_kept_overall == 1.0


def test_bad_inputs_are_rejected():
    a = random_adapter(80)
    with pytest.raises(InvalidMergeOption):
        lowrank_opcm_fold([])
    with pytest.raises(InvalidMergeOption):
        lowrank_opcm_fold([a, a], alpha=1.0)
    with pytest.raises(InvalidMergeOption):
        lowrank_opcm_fold([a, a], max_rank=0)
    bad = dict(a)
    bad["q_proj"] = LoraFactors(a["q_proj"].A.clone(), a["q_proj"].B.clone())
    bad["q_proj"].B[1, 0] = float("-inf")
    with pytest.raises(NonFiniteValues, match="q_proj"):
        lowrank_opcm_fold([a, bad])
    other = {"q_proj": random_factors(torch.Generator().manual_seed(0), (2, 2), 1)}
    with pytest.raises(IncompatibleAdapters):
        lowrank_opcm_fold([a, other])
