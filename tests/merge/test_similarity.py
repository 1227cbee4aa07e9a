import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zenedge.merge.errors import IncompatibleAdapters, NonFiniteValues
from zenedge.merge.factors import LoraFactors
from zenedge.merge.similarity import SimilarityIndex, lora_cosine, rank_by_similarity

from .helpers import random_adapter, ranks, scales, seeds


def dense_cosine(a, b):
    """The definition, on dense matrices: mean over shared modules of cos(flat ΔW)."""
    cosines = []
    for name in a:
        if name in b:
            x, y = a[name].delta().reshape(-1), b[name].delta().reshape(-1)
            denom = x.norm() * y.norm()
            cosines.append(0.0 if denom == 0 else float(x @ y / denom))
    return sum(cosines) / len(cosines) if cosines else 0.0


def negated(adapter):
    return {n: LoraFactors(f.A, -f.B, f.scale) for n, f in adapter.items()}


@settings(max_examples=40, deadline=None)
@given(s1=seeds, s2=seeds, r1=ranks, r2=ranks, c1=scales, c2=scales)
def test_equals_dense_computation(s1, s2, r1, r2, c1, c2):
    a, b = random_adapter(s1, r1, c1), random_adapter(s2, r2, c2)
    assert lora_cosine(a, b) == pytest.approx(dense_cosine(a, b), abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(s1=seeds, s2=seeds, r1=ranks, r2=ranks)
def test_symmetric(s1, s2, r1, r2):
    a, b = random_adapter(s1, r1), random_adapter(s2, r2)
    assert lora_cosine(a, b) == pytest.approx(lora_cosine(b, a), abs=1e-14)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, rank=ranks, scale=scales)
def test_self_similarity_is_one_and_negation_minus_one(seed, rank, scale):
    a = random_adapter(seed, rank, scale)
    assert lora_cosine(a, a) == pytest.approx(1.0, abs=1e-12)
    assert lora_cosine(a, negated(a)) == pytest.approx(-1.0, abs=1e-12)


def test_positive_scale_is_ignored():
    a = random_adapter(1)
    rescaled = {n: LoraFactors(f.A, f.B, f.scale * 37.0) for n, f in a.items()}
    b = random_adapter(2)
    assert lora_cosine(rescaled, b) == pytest.approx(lora_cosine(a, b), abs=1e-14)


def test_zero_update_counts_as_zero_not_nan():
    a = random_adapter(4)
    fresh = {n: LoraFactors(f.A, torch.zeros_like(f.B), f.scale) for n, f in a.items()}  # a new LoRA: B = 0
    assert lora_cosine(a, fresh) == 0.0
    assert lora_cosine(fresh, fresh) == 0.0
    half = dict(a)
    half["q_proj"] = fresh["q_proj"]
    assert lora_cosine({"q_proj": a["q_proj"]}, {"q_proj": half["q_proj"]}) == 0.0
    assert lora_cosine(a, half) == pytest.approx((len(a) - 1) / len(a), abs=1e-12)


def test_mean_runs_over_shared_modules_only():
    a = random_adapter(5)
    only_q = {"q_proj": a["q_proj"], "extra": LoraFactors(torch.randn(1, 3), torch.randn(2, 1))}
    assert lora_cosine(a, only_q) == pytest.approx(1.0, abs=1e-12)
    assert lora_cosine(a, {"other": a["q_proj"]}) == 0.0


def test_non_finite_and_mismatched_inputs_are_rejected():
    a = random_adapter(6)
    bad = dict(a)
    bad["k_proj"] = LoraFactors(a["k_proj"].A.clone(), a["k_proj"].B.clone())
    bad["k_proj"].A[0, 0] = float("nan")
    with pytest.raises(NonFiniteValues, match="k_proj"):
        lora_cosine(a, bad)
    with pytest.raises(NonFiniteValues, match="k_proj"):
        rank_by_similarity(a, {"x": bad})
    with pytest.raises(NonFiniteValues, match="k_proj"):
        rank_by_similarity(bad, {"x": a})
    wrong = {"q_proj": LoraFactors(torch.randn(2, 4, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64))}
    with pytest.raises(IncompatibleAdapters):
        lora_cosine(a, wrong)
    with pytest.raises(IncompatibleAdapters):
        rank_by_similarity(wrong, {"x": a})


@settings(max_examples=15, deadline=None)
@given(new_seed=seeds, pool_seeds=st.lists(seeds, min_size=1, max_size=6, unique=True), rank=ranks)
def test_index_agrees_with_pairwise_and_sorts_descending(new_seed, pool_seeds, rank):
    new = random_adapter(new_seed, rank)
    pool = {f"p{i}": random_adapter(s, 1 + i % 3) for i, s in enumerate(pool_seeds)}
    ranked = rank_by_similarity(new, pool)
    assert sorted(pid for pid, _ in ranked) == sorted(pool)
    sims = [sim for _, sim in ranked]
    assert sims == sorted(sims, reverse=True)
    for pid, sim in ranked:
        assert sim == pytest.approx(lora_cosine(new, pool[pid]), abs=1e-10)


def test_ranking_finds_the_near_duplicate_in_a_mixed_pool():
    new = random_adapter(10)
    near = {n: LoraFactors(f.A + 0.05 * torch.randn_like(f.A), f.B, 2.0) for n, f in new.items()}
    pool = {"a": random_adapter(11), "near": near, "anti": negated(new), "partial": {"q_proj": new["q_proj"]}}
    ranked = rank_by_similarity(new, pool)
    assert [pid for pid, _ in ranked][:2] in (["partial", "near"], ["near", "partial"])
    assert ranked[-1][0] == "anti" and ranked[-1][1] == pytest.approx(-1.0, abs=1e-12)


def test_index_handles_float32_and_bfloat16_factors():
    a = random_adapter(12)
    as32 = {n: LoraFactors(f.A.float(), f.B.float(), f.scale) for n, f in a.items()}
    as16 = {n: LoraFactors(f.A.bfloat16(), f.B.bfloat16(), f.scale) for n, f in a.items()}
    index = SimilarityIndex({"32": as32, "16": as16})
    sims = index.cosines(a)
    assert sims["32"] == pytest.approx(1.0, abs=1e-6)
    assert sims["16"] == pytest.approx(1.0, abs=1e-2)
    assert all(math.isfinite(s) for s in sims.values())



def test_index_follows_adds_and_removes():
    new = random_adapter(13)
    index = SimilarityIndex({"x": random_adapter(14)})
    index.add("same", new)
    assert index.query(new)[0] == ("same", pytest.approx(1.0, abs=1e-12))
    index.add("same", negated(new))  # replacing a member
    assert index.cosines(new)["same"] == pytest.approx(-1.0, abs=1e-12)
    index.remove("same")
    assert index.ids == ["x"]


def test_design_tuple_form_is_accepted():
    a, b = random_adapter(15, scale=1.0), random_adapter(16, scale=1.0)
    as_tuples = {n: (f.A, f.B) for n, f in b.items()}
    assert lora_cosine(a, as_tuples) == pytest.approx(lora_cosine(a, b), abs=1e-14)
    with pytest.raises(IncompatibleAdapters, match="q_proj"):
        lora_cosine(a, {"q_proj": "not factors"})
