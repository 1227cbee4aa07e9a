"""Scale distillation on a tiny random llama, and the calibration helpers."""

from __future__ import annotations

import torch

from zenedge.bitdelta.calibration import build_calibration_batches, stdlib_texts
from zenedge.bitdelta.compressor import compress_model
from zenedge.bitdelta.distill import ScaledSignLinear, apply_bitdelta, distill_scales, with_alphas
from zenedge.bitdelta.fileformat import load_bitdelta, save_bitdelta
from zenedge.bitdelta.packing import unpack_signs


def _batches(count=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (2, 24), generator=gen) for _ in range(count)]


def test_distillation_lowers_the_logit_loss(checkpoints, tmp_path):
    base, tuned, base_dir, tuned_dir = checkpoints
    data = load_bitdelta(compress_model(base_dir, tuned_dir, tmp_path / "d.bitdelta").out_path)
    result = distill_scales(base, tuned, data, _batches(), steps=25, lr=3e-3)
    assert result.loss_after < 0.9 * result.loss_before
    assert set(result.alphas) == set(data.modules)
    changed = sum(not torch.allclose(result.alphas[n], data.modules[n][1]) for n in data.modules)
    assert changed == len(data.modules)
    # The base model itself is untouched: the swap happened on a copy.
    assert not any(isinstance(m, ScaledSignLinear) for m in base.modules())


def test_applied_model_computes_base_plus_scaled_signs(checkpoints, tmp_path):
    base, tuned, base_dir, tuned_dir = checkpoints
    data = load_bitdelta(compress_model(base_dir, tuned_dir, tmp_path / "d.bitdelta").out_path)
    model = apply_bitdelta(base, data)
    name = "model.layers.0.self_attn.q_proj"
    layer = model.get_submodule(name)
    packed, alpha, n = data.modules[name]
    x = torch.randn(3, n)
    w_hat = base.get_submodule(name).weight + alpha[:, None] * unpack_signs(packed, n)
    assert torch.allclose(layer(x), x @ w_hat.T, atol=1e-5)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(m.log_scale) for m in model.modules() if isinstance(m, ScaledSignLinear)}
    norm = model.model.layers[1].post_attention_layernorm.weight
    assert torch.equal(norm, tuned.model.layers[1].post_attention_layernorm.weight)


def test_distilled_alphas_round_trip_through_the_file(checkpoints, tmp_path):
    base, tuned, base_dir, tuned_dir = checkpoints
    data = load_bitdelta(compress_model(base_dir, tuned_dir, tmp_path / "d.bitdelta").out_path)
    result = distill_scales(base, tuned, data, _batches(1), steps=2, lr=1e-3)
    saved = load_bitdelta(save_bitdelta(tmp_path / "e.bitdelta", with_alphas(data, result.alphas)))
    for name, alpha in result.alphas.items():
        assert torch.equal(saved.modules[name][1], alpha)


class _CharTokenizer:
    eos_token_id = 0

    def __call__(self, text):
        return {"input_ids": [min(ord(c), 255) for c in text]}


def test_calibration_batches_from_text():
    texts = ["hello world " * 40, "another text " * 30]
    batches = build_calibration_batches(texts, _CharTokenizer(), seq_len=32, batch_size=4)
    total = sum(len(t) + 1 for t in texts)
    assert len(batches) == total // (32 * 4)
    assert all(b.shape == (4, 32) and b.dtype == torch.long for b in batches)
    assert build_calibration_batches(texts, _CharTokenizer(), seq_len=32, batch_size=4, max_batches=2).__len__() == 2


def test_stdlib_texts_are_available_offline():
    texts = stdlib_texts(limit=3)
    assert len(texts) == 3 and all(len(t) >= 2000 for t in texts)


def test_distilled_scales_stay_positive_and_never_fit_worse(checkpoints, tmp_path):
    base, tuned, base_dir, tuned_dir = checkpoints
    data = load_bitdelta(compress_model(base_dir, tuned_dir, tmp_path / "d.bitdelta").out_path)
    result = distill_scales(base, tuned, data, _batches(2), steps=5, lr=0.5)  # a reckless step size
    assert result.loss_after <= result.loss_before
    assert all(bool((a > 0).all()) for a in result.alphas.values())
