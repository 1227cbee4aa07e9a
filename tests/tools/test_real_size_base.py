"""tools/real_size_base.py writes a base zenedge and transformers load: sharded bf16 weights with
their index, the published shape's config, the embedded base's tokenizer."""

import json

import torch

from tools.real_size_base import SHAPES, build


def test_a_built_base_loads_with_its_shape_and_the_default_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM

    from zenedge.runtime.model import load_resident

    out = build("test-tiny", tmp_path / "base", seed=1)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out)
    assert set(index["weight_map"]) == {n for n in model.state_dict() if n != "lm_head.weight"}   # tied
    assert model.config.hidden_size == SHAPES["test-tiny"]["hidden_size"] and model.dtype == torch.bfloat16
    resident = load_resident("big", out, torch.device("cpu"), torch.float32, "int4")
    assert len(resident.tokenizer) == model.config.vocab_size == 49152 and resident.tokenizer.chat_template
    logits = resident.model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 49152) and torch.isfinite(logits).all()
