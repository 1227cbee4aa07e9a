"""bf16 on CPU: weights packed for oneDNN's linear give the plain bf16 model's logits (up to
bf16 rounding) and keep the tied head tied (a dense BitDelta on a packed base: test_cpu_weights.py)."""

import pytest
import torch

from zenedge.runtime import cpu_weights
from zenedge.runtime.layers import FastLinear, VariantLinear
from zenedge.runtime.model import load_resident

CPU = torch.device("cpu")
needs_onednn_bf16 = pytest.mark.skipif(not cpu_weights.onednn_bf16_available(),
                                       reason="this torch has no oneDNN bf16 linear")


def test_auto_dtype_is_fp32_on_cpu_and_bf16_stays_selectable():
    from zenedge.runtime.device import pick_dtype

    assert pick_dtype("auto", CPU) == torch.float32          # BENCHMARKS.md: bf16 not reliably faster here
    assert pick_dtype("bfloat16", CPU) == torch.bfloat16
    assert cpu_weights.fast_copy(torch.zeros(16, 32), "full") is None               # fp32 "full" runs plain
    assert cpu_weights.fast_copy(torch.zeros(16, 32, dtype=torch.bfloat16, device="meta"), "full") is None


@needs_onednn_bf16
def test_packed_bf16_model_matches_the_plain_one(tiny_base_dir, monkeypatch):
    packed = load_resident("tiny", tiny_base_dir, CPU, torch.bfloat16)
    monkeypatch.setattr("zenedge.runtime.model.convert_model", lambda model, fmt, **kwargs: 0)
    plain = load_resident("tiny", tiny_base_dir, CPU, torch.bfloat16)
    fp32 = load_resident("tiny", tiny_base_dir, CPU, torch.float32)
    linears = [m for m in packed.model.modules() if isinstance(m, VariantLinear)]
    assert linears and all(isinstance(m.fast, cpu_weights.OneDnnBF16) for m in linears)
    assert isinstance(packed.model.lm_head, FastLinear)
    assert packed.model.lm_head.weight is packed.model.model.embed_tokens.weight     # still tied
    assert all(m.fast is None for m in plain.model.modules() if isinstance(m, VariantLinear))
    ids = torch.randint(3, 99, (3, 10))
    with torch.inference_mode():
        got = packed.model(input_ids=ids).logits.float()
        want = plain.model(input_ids=ids).logits.float()
        exact = fp32.model(input_ids=ids).logits
    scale = exact.abs().max()
    assert (got - want).abs().max() < 0.02 * scale
    assert (got - exact).abs().max() < 0.03 * scale
    assert (got - exact).abs().max() > 0            # it did run in bf16
