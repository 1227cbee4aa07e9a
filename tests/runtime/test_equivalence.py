"""zenedge's patched base computes what the reference libraries compute."""

import pytest
import torch

from zenedge.runtime.layers import RowVariants


def logits_with(engine, name, input_ids):
    route = engine.router.route(name)
    resident = engine.resident(route.base)
    variant = engine.variant(route)
    with torch.inference_mode(), resident.state.using([variant] * input_ids.shape[0]):
        return resident.model(input_ids=input_ids).logits


@pytest.mark.parametrize("rslora", [False, True])
def test_lora_logits_equal_peft(engine, imported, peft_adapter, tiny_base_dir, rslora):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    imported("w", seed=1, rslora=rslora)
    input_ids = torch.randint(3, 99, (2, 12))
    ours = logits_with(engine, "w", input_ids)
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base_dir),
                                          peft_adapter(1, rslora=rslora)).eval()
    with torch.no_grad():
        expected = reference(input_ids=input_ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()(input_ids=input_ids).logits
    assert (ours - base).abs().max() > 1e-2, "the adapter must change the output for this test to mean anything"
    assert (ours - expected).abs().max() < 1e-4


def test_base_weights_are_never_modified(engine, imported):
    imported("w", seed=1)
    resident = engine.resident("tiny")
    before = {k: v.clone() for k, v in resident.model.state_dict().items()}
    logits_with(engine, "w", torch.randint(3, 99, (1, 8)))
    after = resident.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_plain_base_equals_transformers(engine, tiny_base_dir):
    from transformers import AutoModelForCausalLM

    input_ids = torch.randint(3, 99, (1, 10))
    ours = logits_with(engine, "tiny", input_ids)
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()(input_ids=input_ids).logits
    assert (ours - expected).abs().max() < 1e-5


def test_mixed_batch_rows_equal_running_alone(engine, imported):
    imported("a", seed=1)
    imported("b", seed=2, targets=("q_proj", "v_proj"), r=2)
    resident = engine.resident("tiny")
    variants = [engine.variant(engine.router.route(n)) for n in ("a", "b")]
    rows = [variants[0], None, variants[1], variants[0]]
    input_ids = torch.randint(3, 99, (4, 9))
    with torch.inference_mode():
        with resident.state.using(rows):
            mixed = resident.model(input_ids=input_ids).logits
        for i, variant in enumerate(rows):
            with resident.state.using([variant]):
                alone = resident.model(input_ids=input_ids[i:i + 1]).logits
            assert (mixed[i] - alone[0]).abs().max() < 1e-4


def test_row_grouping():
    class V:
        def __init__(self, key):
            self.key = key
    a, b = V("a"), V("b")
    batch = RowVariants.build([a, None, b, a], torch.device("cpu"))
    assert batch.uniform is None
    assert {v.key: idx.tolist() for v, idx in batch.groups} == {"a": [0, 3], "b": [2]}
    assert RowVariants.build([a, a], torch.device("cpu")).uniform is a
    assert RowVariants.build([None, None], torch.device("cpu")).groups == []
