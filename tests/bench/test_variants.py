"""The bench's variants made from a base's shapes alone (bench/variants.py), and `bench run`'s
memory plan: they must be what the runtime loads, at any base size, without a model in memory."""

import math
from types import SimpleNamespace

import pytest
import torch

from zenedge.bench import throughput
from zenedge.bench.variants import LORA_TARGETS, make_bitdelta, make_lora
from zenedge.errors import Unavailable


def test_a_lora_from_the_skeleton_is_a_peft_adapter_of_the_base(tiny_base_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = make_lora(tiny_base_dir, tmp_path / "lora", seed=1)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base_dir), out)
    factors = {n: p for n, p in model.named_parameters() if "lora_" in n}
    layers = model.config.num_hidden_layers
    assert len(factors) == 2 * len(LORA_TARGETS) * layers
    assert all(p.abs().sum() > 0 and torch.isfinite(p).all() for p in factors.values())   # B is not PEFT's zero
    ids = torch.randint(3, 200, (1, 6))
    with torch.no_grad():
        with_adapter = model(ids).logits
        with model.disable_adapter():
            without = model(ids).logits
    assert not torch.equal(with_adapter, without)


def test_a_random_bitdelta_has_a_sign_row_per_projection(tiny_base_dir, tmp_path):
    from zenedge.runtime.variants import load_bitdelta

    path = make_bitdelta(tiny_base_dir, tmp_path / "d.bitdelta", seed=3, scale=2e-3, base_sha256="abc")
    variant = load_bitdelta("d", path, torch.device("cpu"))
    layers = 2
    assert len(variant.modules) == 7 * layers
    module = next(iter(variant.modules.values()))
    assert torch.allclose(module.alpha, torch.full_like(module.alpha, 2e-3 * math.sqrt(2 / math.pi)))
    again = make_bitdelta(tiny_base_dir, tmp_path / "e.bitdelta", seed=3, base_sha256="abc")
    assert again.read_bytes() == path.read_bytes()                      # seeded


@pytest.mark.parametrize("free, expected", [(1 << 50, "all"), ("alone", "alone"), (1, "refused")])
def test_bench_run_loads_what_fits(tiny_base_dir, monkeypatch, free, expected):
    import psutil

    setups = throughput.precisions()
    alone = throughput._memory_needed(tiny_base_dir, {"int4": setups["int4"]}, False)
    available = alone if free == "alone" else free
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=available))
    said = []
    if expected == "refused":
        with pytest.raises(Unavailable, match="bench run needs about"):
            throughput._fitting_setups(tiny_base_dir, setups, "int4", said.append)
        return
    chosen, with_transformers = throughput._fitting_setups(tiny_base_dir, setups, "int4", said.append)
    assert (chosen == setups and with_transformers and not said) if expected == "all" else \
        (list(chosen) == ["int4"] and not with_transformers and len(said) == 1)
