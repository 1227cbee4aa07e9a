import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zenedge.merge.errors import IncompatibleAdapters, InvalidMergeOption, NonFiniteValues, UnknownMergeMethod
from zenedge.merge.factors import LoraFactors
from zenedge.merge.kmerge_linear import kmerge_linear, running_average_weights
from zenedge.merge.methods import MERGE_METHODS, merge
from zenedge.merge.opcm import opcm_fold
from zenedge.merge.soups import monosoup, svd_soup
from zenedge.merge.sparse_merges import dare_merge, ties_merge

from .helpers import dense, random_adapter, seeds, snapshot, unchanged

ALL = sorted(MERGE_METHODS)


def inputs_for(method, seed=0):
    count = 1 if method == "monosoup" else 3
    return [random_adapter(seed + i, rank=2, scale=0.5 + i) for i in range(count)]


def test_the_table_lists_every_method():
    assert set(ALL) == {"kmerge-linear", "ties", "dare", "dare-ties", "monosoup", "svd-soup", "opcm", "opcm-dense"}
    with pytest.raises(UnknownMergeMethod, match="ties"):  # the hint lists the known names
        merge("average", inputs_for("ties"))


@pytest.mark.parametrize("method", ALL)
def test_every_method_caps_rank_reports_energy_and_leaves_inputs_alone(method):
    adapters = inputs_for(method)
    before = [snapshot(a) for a in adapters]
    for cap in (1, "member"):
        result = merge(method, adapters, max_rank=cap)
        limit = 1 if cap == 1 else 2
        assert result.method == method
        assert set(result.adapter) == set(adapters[0])
        for name, f in result.adapter.items():
            assert f.rank <= limit and f.scale == 1.0
            assert torch.isfinite(f.A).all() and torch.isfinite(f.B).all()
            assert 0.0 <= result.truncation.energy_kept[name] <= 1.0
        assert 0.0 <= result.truncation.energy_kept_overall <= 1.0
        for f in result.adapter.values():  # the result must not alias an input
            f.A.add_(1.0)
    assert all(unchanged(a, b) for a, b in zip(adapters, before))


@pytest.mark.parametrize("method", ALL)
def test_every_method_rejects_non_finite_inputs(method):
    adapters = inputs_for(method)
    poisoned = dict(adapters[-1])
    poisoned["up_proj"] = LoraFactors(poisoned["up_proj"].A.clone(), poisoned["up_proj"].B.clone())
    poisoned["up_proj"].A[0, 1] = float("nan")
    with pytest.raises(NonFiniteValues, match="up_proj"):
        merge(method, adapters[:-1] + [poisoned])


def test_overflowing_result_is_rejected():
    huge = {"m": LoraFactors(torch.full((1, 2), 1e30), torch.full((2, 1), 1e30))}  # float32: B·A overflows
    with pytest.raises(NonFiniteValues, match="overflow"):
        merge("ties", [huge, huge], max_rank=None)


def test_rank_cap_and_counts_are_validated():
    adapters = inputs_for("ties")
    with pytest.raises(InvalidMergeOption):
        merge("ties", adapters, max_rank=0)
    with pytest.raises(InvalidMergeOption, match="exactly 1"):
        merge("monosoup", adapters)
    with pytest.raises(InvalidMergeOption):
        merge("opcm", [])
    for method in ("opcm", "opcm-dense"):
        with pytest.raises(InvalidMergeOption, match="alpha"):
            merge(method, adapters[:1], alpha=1.5)


# --- kmerge-linear: PEFT "linear" in factor space ------------------------------------------


@settings(max_examples=25, deadline=None)
@given(s1=seeds, s2=seeds, w=st.floats(0.05, 0.95))
def test_kmerge_linear_has_the_cross_terms(s1, s2, w):
    a, b = random_adapter(s1, scale=0.5), random_adapter(s2, scale=2.0)
    result = kmerge_linear([a, b], weights=[1 - w, w], max_rank=None)
    for name, f in result.adapter.items():
        ra, rb = math.sqrt((1 - w) * 0.5), math.sqrt(w * 2.0)
        B = ra * a[name].B + rb * b[name].B
        A = ra * a[name].A + rb * b[name].A
        torch.testing.assert_close(f.delta(), B @ A)  # = Σ w_i s_i B_i A_i + cross terms
    assert result.truncation.energy_kept_overall == 1.0


def test_kmerge_linear_weight_scales_and_negates_a_single_adapter():
    a = random_adapter(3, scale=0.5)
    for w in (1.0, -1.0, 0.25):
        result = kmerge_linear([a], weights=[w], max_rank=None)
        for name, f in result.adapter.items():
            torch.testing.assert_close(f.delta(), w * a[name].delta())


def test_kmerge_linear_needs_one_rank_per_module_and_skips_absent_adapters():
    with pytest.raises(IncompatibleAdapters, match="rank"):
        kmerge_linear([random_adapter(1, rank=2), random_adapter(2, rank=3)])
    a = random_adapter(4)
    only_q = {"q_proj": random_adapter(5)["q_proj"]}
    result = kmerge_linear([a, only_q], weights=[0.5, 0.5], max_rank=None)
    torch.testing.assert_close(result.adapter["k_proj"].delta(), 0.5 * a["k_proj"].delta())  # no renormalising


def test_running_average_weights():
    assert running_average_weights(2) == (0.5, 0.5)
    assert running_average_weights(4) == pytest.approx((0.75, 0.25))
    with pytest.raises(InvalidMergeOption):
        running_average_weights(0)
    slot, new = random_adapter(6), random_adapter(7)
    by_count = merge("kmerge-linear", [slot, new], members_after=4, max_rank=None)
    by_weights = kmerge_linear([slot, new], weights=[0.75, 0.25], max_rank=None)
    for name, f in by_count.adapter.items():
        torch.testing.assert_close(f.delta(), by_weights.adapter[name].delta())
    with pytest.raises(InvalidMergeOption):
        kmerge_linear([slot, new], members_after=3, weights=[0.5, 0.5])


def _tiny_peft_model():
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=32,
    )
    model = transformers.LlamaForCausalLM(config)
    targets = ["q_proj", "k_proj", "up_proj"]
    lora = peft.LoraConfig(r=2, lora_alpha=4, target_modules=targets, init_lora_weights=False)
    peft_model = peft.get_peft_model(model, lora, adapter_name="first")
    peft_model.add_adapter("second", peft.LoraConfig(r=2, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    return peft_model


def _lora_layers(peft_model):
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in peft_model.named_modules() if isinstance(m, LoraLayer)}


def _factors(layers, adapter):
    return {
        name: LoraFactors(m.lora_A[adapter].weight.detach().clone(), m.lora_B[adapter].weight.detach().clone(), m.scaling[adapter])
        for name, m in layers.items()
    }


def test_kmerge_linear_and_ties_match_peft_add_weighted_adapter():
    peft_model = _tiny_peft_model()
    layers = _lora_layers(peft_model)
    assert len(layers) == 3
    a, b = _factors(layers, "first"), _factors(layers, "second")
    peft_model.add_weighted_adapter(["first", "second"], [0.7, 0.3], "linear", combination_type="linear")
    peft_model.add_weighted_adapter(["first", "second"], [1.0, 1.0], "ties", combination_type="ties_svd", density=0.5)
    ours_linear = kmerge_linear([a, b], weights=[0.7, 0.3])
    ours_ties = ties_merge([a, b], weights=[1.0, 1.0], density=0.5, max_rank=2)
    for name, layer in layers.items():
        peft_linear = _factors({name: layer}, "linear")[name]
        assert peft_linear.scale == 1.0  # PEFT sets lora_alpha = r for the merged adapter, as we do
        torch.testing.assert_close(ours_linear.adapter[name].A, peft_linear.A)  # the factors themselves
        torch.testing.assert_close(ours_linear.adapter[name].B, peft_linear.B)
        peft_ties = _factors({name: layer}, "ties")[name]
        torch.testing.assert_close(ours_ties.adapter[name].delta(), peft_ties.delta(), rtol=1e-4, atol=1e-5)


# --- TIES / DARE in product space ---------------------------------------------------------


def test_ties_of_identical_adapters_at_full_density_is_the_adapter():
    a = random_adapter(9)
    result = ties_merge([a, a, a], density=1.0, weights=[1.0, 1.0, 1.0], max_rank=None)
    for name, f in result.adapter.items():
        torch.testing.assert_close(f.delta(), a[name].delta())


def test_ties_disjoint_mean_drops_the_outvoted_sign():
    x = torch.tensor([[1.0, -2.0], [3.0, 0.5]], dtype=torch.float64)
    as_adapter = lambda m: {"m": LoraFactors(torch.eye(2, dtype=torch.float64), m)}  # noqa: E731
    result = ties_merge([as_adapter(x), as_adapter(x), as_adapter(-0.1 * x)], density=1.0, max_rank=None)
    torch.testing.assert_close(result.adapter["m"].delta(), x)  # the minority entries are not averaged in


def test_dare_at_full_density_is_the_weighted_sum():
    a, b = random_adapter(11), random_adapter(12)
    result = dare_merge([a, b], density=1.0, weights=[0.3, 0.7], max_rank=None)
    for name, f in result.adapter.items():
        torch.testing.assert_close(f.delta(), 0.3 * a[name].delta() + 0.7 * b[name].delta())


def test_dare_is_seeded_per_module():
    a, b = random_adapter(13), random_adapter(14)
    first = dare_merge([a, b], density=0.5, seed=7, max_rank=None)
    again = dare_merge([a, b], density=0.5, seed=7, max_rank=None)
    other = dare_merge([a, b], density=0.5, seed=8, max_rank=None)
    fewer = dare_merge([{"q_proj": a["q_proj"]}, {"q_proj": b["q_proj"]}], density=0.5, seed=7, max_rank=None)
    torch.testing.assert_close(first.adapter["q_proj"].delta(), again.adapter["q_proj"].delta())
    torch.testing.assert_close(first.adapter["q_proj"].delta(), fewer.adapter["q_proj"].delta())
    assert not torch.allclose(first.adapter["q_proj"].delta(), other.adapter["q_proj"].delta())


def test_dare_averages_to_the_plain_mean_over_seeds():
    a, b = random_adapter(15), random_adapter(16)
    runs = [dare_merge([a, b], density=0.5, seed=s, max_rank=None).adapter["q_proj"].delta() for s in range(300)]
    mean = torch.stack(runs).mean(dim=0)
    target = 0.5 * (a["q_proj"].delta() + b["q_proj"].delta())
    assert float((mean - target).norm() / target.norm()) < 0.1


def test_density_is_validated():
    a = random_adapter(17)
    with pytest.raises(InvalidMergeOption):
        ties_merge([a], density=1.5)
    with pytest.raises(InvalidMergeOption):
        dare_merge([a], density=0.0)


# --- soups ----------------------------------------------------------------------------------


def monosoup_dense_reference(delta, eps=1e-12):
    """MonoSoup's freevariance update on a dense ΔW, written from the paper's formulas."""
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    probs = s / (s.sum() + eps)
    k = int(min(max(math.ceil(math.exp(float(-(probs * torch.log(probs + eps)).sum()))), 1), s.numel()))
    p_k = float(s[:k].square().sum() / (s.square().sum() + eps))
    rho = float(s[k] / (s[0] + eps)) ** 2 if k < s.numel() else 0.0
    low = rho + (1 - rho) * math.sqrt(max(1 - p_k, 0.0))
    high = (u[:, :k] * s[:k]) @ vh[:k]
    return (1 - low) * high + low * (delta - high)


@settings(max_examples=25, deadline=None)
@given(seed=seeds, rank=st.integers(1, 4))
def test_monosoup_in_low_rank_equals_dense_monosoup(seed, rank):
    a = random_adapter(seed, rank=rank, scale=0.8)
    result = monosoup([a], max_rank=None)
    for name, f in result.adapter.items():
        torch.testing.assert_close(f.delta(), monosoup_dense_reference(a[name].delta()), rtol=1e-8, atol=1e-9)
        details = result.details["modules"][name]
        assert 0.0 <= details["lambda_low"] <= 1.0 and details["lambda_high"] == pytest.approx(1 - details["lambda_low"])


def test_monosoup_leaves_a_rank_one_update_alone():
    a = random_adapter(20, rank=1)  # one σ: k = 1 = #σ, ρ = 0, P_k = σ²/(σ² + ε) → λ_high ≈ 1
    result = monosoup([a], max_rank=None)
    for name, f in result.adapter.items():
        # MonoSoup's ε leaves λ_low = sqrt(ε/σ²) ≈ 1e-7 here, so "alone" holds to ~1e-6.
        torch.testing.assert_close(f.delta(), a[name].delta(), rtol=1e-5, atol=1e-6)


def test_svd_soup_is_the_mean_of_truncated_updates():
    adapters = [random_adapter(30 + i, rank=3) for i in range(3)]
    exact = svd_soup(adapters, rank=3, max_rank=None)
    truncated = svd_soup(adapters, rank=1, max_rank=None)
    for name in adapters[0]:
        torch.testing.assert_close(exact.adapter[name].delta(), sum(a[name].delta() for a in adapters) / 3)
        rank_one = []
        for a in adapters:
            u, s, vh = torch.linalg.svd(a[name].delta(), full_matrices=False)
            rank_one.append(s[0] * torch.outer(u[:, 0], vh[0]))
        torch.testing.assert_close(truncated.adapter[name].delta(), sum(rank_one) / 3)


# --- OPCM through the table -------------------------------------------------------------------


def test_opcm_entries_agree_with_each_other_and_the_dense_fold():
    adapters = [random_adapter(40 + i, rank=2, scale=0.3 * (i + 1)) for i in range(3)]
    low = merge("opcm", adapters, max_rank=None, alpha=0.3)
    high = merge("opcm-dense", adapters, max_rank=None, alpha=0.3)
    reference = opcm_fold([dense(a) for a in adapters], 0.3).merged
    assert low.details["lam"] == pytest.approx(high.details["lam"], rel=1e-10)
    assert len(low.details["energy_kept_per_step"]) == 3
    for name, d in reference.items():
        torch.testing.assert_close(low.adapter[name].delta(), d)
        torch.testing.assert_close(high.adapter[name].delta(), d)
