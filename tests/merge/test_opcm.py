import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zenedge.merge.errors import IncompatibleAdapters, InvalidMergeOption, NonFiniteValues
from zenedge.merge.opcm import opcm_fold, opcm_init, opcm_step, project_dense, task_vector_norm

from .helpers import seeds

alphas = st.floats(min_value=0.0, max_value=0.95)
dims = st.integers(min_value=1, max_value=7)


def fusionbench_projection(delta, tau, alpha):
    """FusionBench's merge_linear_weights projection, written out literally (full SVD)."""
    u, s, vh = torch.linalg.svd(delta, full_matrices=True)
    v = vh.T
    split = int((s.cumsum(dim=0) / s.sum() > alpha).float().argmax())
    projected = u.T @ tau @ v
    projected.diagonal().fill_(0)
    projected[:split, :split] = 0
    return u @ projected @ v.T


def fusionbench_fold(task_vectors, alpha):
    """FusionBench's run loop on dicts: λ, the mean norm, projection of 2-D entries."""
    merged = {k: v.clone() for k, v in task_vectors[0].items()}
    norms, lam = [task_vector_norm(task_vectors[0])], 1.0
    for tau in task_vectors[1:]:
        norms.append(task_vector_norm(tau))
        mean = sum(norms) / len(norms)
        summed = {}
        for k, t in tau.items():
            update = fusionbench_projection(merged[k], t, alpha) if t.ndim == 2 else t
            summed[k] = lam * merged[k] + update
        lam = task_vector_norm(summed) / mean
        merged = {k: v / lam for k, v in summed.items()}
    return merged, lam


def random_task_vector(seed, shapes=((5, 4), (3, 6), (6,))):
    gen = torch.Generator().manual_seed(seed)
    return {f"p{i}": torch.randn(*shape, generator=gen, dtype=torch.float64) for i, shape in enumerate(shapes)}


def low_rank_matrix(gen, out_dim, in_dim, rank):
    return torch.randn(out_dim, rank, generator=gen, dtype=torch.float64) @ torch.randn(
        rank, in_dim, generator=gen, dtype=torch.float64
    )


@settings(max_examples=50, deadline=None)
@given(seed=seeds, out_dim=dims, in_dim=dims, alpha=alphas)
def test_thin_projection_equals_fusionbench_full_matrix_form_on_full_rank(seed, out_dim, in_dim, alpha):
    gen = torch.Generator().manual_seed(seed)
    delta = torch.randn(out_dim, in_dim, generator=gen, dtype=torch.float64)  # full rank a.s.
    tau = torch.randn(out_dim, in_dim, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(project_dense(delta, tau, alpha), fusionbench_projection(delta, tau, alpha), rtol=1e-9, atol=1e-9)


@settings(max_examples=15, deadline=None)
@given(seed=seeds, count=st.integers(min_value=2, max_value=4), alpha=alphas)
def test_opcm_fold_equals_fusionbench_loop(seed, count, alpha):
    task_vectors = [random_task_vector(seed + i) for i in range(count)]
    expected, expected_lam = fusionbench_fold(task_vectors, alpha)
    state = opcm_fold(task_vectors, alpha)
    assert state.lam == pytest.approx(expected_lam, rel=1e-10)
    for k in expected:
        torch.testing.assert_close(state.merged[k], expected[k], rtol=1e-9, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(seed=seeds, count=st.integers(min_value=1, max_value=4), alpha=alphas)
def test_merged_norm_is_mean_task_norm_after_every_step(seed, count, alpha):
    task_vectors = [random_task_vector(seed + i) for i in range(count)]
    state = opcm_init(task_vectors[0])
    assert state.count == 1 and state.lam == 1.0
    for tau in task_vectors[1:]:
        state = opcm_step(state, tau, alpha)
        assert task_vector_norm(state.merged) == pytest.approx(sum(state.norms) / state.count, rel=1e-10)
    assert state.count == count


@settings(max_examples=40, deadline=None)
@given(seed=seeds, out_dim=dims, in_dim=dims, rank=st.integers(1, 3), alpha=alphas)
def test_projected_update_is_orthogonal_to_the_merge_even_when_it_is_low_rank(seed, out_dim, in_dim, rank, alpha):
    gen = torch.Generator().manual_seed(seed)
    delta = low_rank_matrix(gen, out_dim, in_dim, rank)
    tau = torch.randn(out_dim, in_dim, generator=gen, dtype=torch.float64)
    update = project_dense(delta, tau, alpha)
    assert abs(float((delta * update).sum())) <= 1e-9 * float(delta.norm() * tau.norm())


def test_diagonal_rule_skips_directions_beyond_the_merge_rank():
    gen = torch.Generator().manual_seed(3)
    u = torch.linalg.qr(torch.randn(5, 1, generator=gen, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(4, 1, generator=gen, dtype=torch.float64))[0]
    delta = 2.0 * u @ v.T  # rank 1: s = (2, 0, 0, 0), so r = first index past α = 0
    tau = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    expected = tau - float(u.T @ tau @ v) * (u @ v.T)  # only the one real coupling goes
    torch.testing.assert_close(project_dense(delta, tau, 0.5), expected, rtol=1e-12, atol=1e-12)


def test_entries_that_are_not_2d_are_added_plainly():
    first, second = random_task_vector(1), random_task_vector(2)
    state = opcm_step(opcm_init(first), second, 0.5)
    torch.testing.assert_close(state.lam * state.merged["p2"], first["p2"] + second["p2"], rtol=1e-12, atol=1e-12)
    plain = opcm_step(opcm_init(first), second, 0.5, is_projected=lambda name, t: False)
    for k in first:
        torch.testing.assert_close(plain.lam * plain.merged[k], first[k] + second[k], rtol=1e-12, atol=1e-12)


def test_resuming_from_a_state_equals_one_pass():
    task_vectors = [random_task_vector(10 + i) for i in range(4)]
    one_pass = opcm_fold(task_vectors, 0.4)
    resumed = opcm_fold(task_vectors[:2], 0.4)
    for tau in task_vectors[2:]:
        resumed = opcm_step(resumed, tau, 0.4)
    assert resumed.norms == pytest.approx(one_pass.norms) and resumed.lam == pytest.approx(one_pass.lam)
    for k in one_pass.merged:
        torch.testing.assert_close(resumed.merged[k], one_pass.merged[k])


def test_inputs_and_earlier_states_are_never_written():
    task_vectors = [random_task_vector(20 + i) for i in range(3)]
    before = [{k: v.clone() for k, v in tv.items()} for tv in task_vectors]
    first = opcm_init(task_vectors[0])
    first_merged = {k: v.clone() for k, v in first.merged.items()}
    opcm_step(opcm_step(first, task_vectors[1]), task_vectors[2])
    result = opcm_fold(task_vectors).merged
    result["p0"].add_(1.0)  # the result must not alias an input
    for tv, snap in zip(task_vectors, before):
        for k in tv:
            assert torch.equal(tv[k], snap[k])
    for k in first.merged:
        assert torch.equal(first.merged[k], first_merged[k])


def test_missing_entries_count_as_zero():
    a = random_task_vector(30, shapes=((4, 3), (5,)))
    b = random_task_vector(31, shapes=((4, 3),))
    c = {"p0": torch.zeros(4, 3, dtype=torch.float64), "p1": torch.randn(5, dtype=torch.float64)}
    sparse = opcm_fold([b, a, c]).merged
    filled = opcm_fold([{**b, "p1": torch.zeros(5, dtype=torch.float64)}, a, c]).merged
    for k in filled:
        torch.testing.assert_close(sparse[k], filled[k])


def test_all_zero_task_vectors_give_zero_not_nan():
    zero = {"w": torch.zeros(3, 4), "b": torch.zeros(3)}
    state = opcm_fold([zero, zero, zero])
    assert state.lam == 1.0
    assert all(float(v.abs().max()) == 0.0 for v in state.merged.values())
    later = opcm_step(state, {"w": torch.ones(3, 4), "b": torch.zeros(3)})
    assert task_vector_norm(later.merged) == pytest.approx(math.sqrt(12) / 4)


def test_bad_inputs_are_rejected():
    a = random_task_vector(40)
    with pytest.raises(InvalidMergeOption):
        opcm_fold([])
    for alpha in (-0.1, 1.0, 2.0):
        with pytest.raises(InvalidMergeOption):
            opcm_fold([a, a], alpha)
    bad = {k: v.clone() for k, v in a.items()}
    bad["p1"][0, 0] = float("nan")
    with pytest.raises(NonFiniteValues, match="p1"):
        opcm_fold([a, bad])
    with pytest.raises(IncompatibleAdapters, match="p0"):
        opcm_fold([a, {"p0": torch.zeros(2, 2, dtype=torch.float64)}])
