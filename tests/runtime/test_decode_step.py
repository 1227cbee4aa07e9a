"""The decode step in one C call (c_step.FusedStep, kernels/native/decode_step.c): where it runs (base
rows, LoRAs, packed BitDeltas, any mix of them, a hot BitDelta's int4 copies serving every row) its
logits are bit for bit those of the Python step it replaces, so a request decodes the same whichever
path a batch takes; where it cannot (a dense copy in a mixed batch, a dense copy dropped
mid-request) the Python step runs."""

import pytest
import torch

from tests.runtime.test_batch_invariance import NAMES, int4_engine, requests_for  # noqa: F401 (a fixture)
from zenedge.kernels import native
from zenedge.runtime import c_step, lean_llama
from zenedge.runtime.decode import decode_path
from zenedge.runtime.layers import RowVariants
from zenedge.runtime import generate as generate_module
from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate

pytestmark = pytest.mark.skipif(native.decode_step() is None, reason="no native CPU kernels on this machine")


@pytest.fixture
def kernels():
    return "native"


def head_inputs(resident, requests, monkeypatch, fused: bool):
    """Every decode step's logits (the head's products) of `requests` run as one batch, and
    whether each step's forward had a C step."""
    head = resident.model.lm_head.fast
    steps, built = [], []
    product, build = head._matmul, c_step.FusedStep.build

    def recording(x):
        y = product(x)
        steps.append(y.clone())
        return y

    def building(*args):
        made = build(*args) if fused else None
        built.append(made is not None)
        return made

    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", 1024)     # every row prefilled in the first tick
    monkeypatch.setattr(head, "_matmul", recording, raising=False)
    monkeypatch.setattr(c_step.FusedStep, "build", building)
    for _ in generate(resident, requests):
        pass
    monkeypatch.undo()
    return steps, built


MIXED = ["lora-a", "tiny", "delta-packed", "lora-b", "delta-packed", "lora-a", "tiny", "lora-b", "delta-packed"]


@pytest.mark.parametrize("names", [["tiny"], ["lora-a"], ["lora-b"], ["delta"], ["tiny", "tiny"],
                                   ["lora-a", "lora-a", "lora-a"], ["delta-packed"], ["lora-a", "tiny", "delta"],
                                   ["lora-a", "tiny", "delta-packed"], ["delta-packed", "delta-packed", "tiny"],
                                   MIXED, MIXED[::-1] + MIXED[:7]])
def test_the_c_step_gives_the_python_steps_logits_bit_for_bit(int4_engine, monkeypatch, names):
    resident = int4_engine.resident("tiny")
    all_requests = requests_for(int4_engine)
    variants = {name: r.variant for name, r in zip(NAMES, all_requests)}
    requests = [GenerationRequest(all_requests[1].input_ids, variants[name], SamplingParams(max_tokens=10))
                for name in names]
    c_steps, built = head_inputs(resident, requests, monkeypatch, fused=True)
    python_steps, _ = head_inputs(resident, requests, monkeypatch, fused=False)
    assert len(c_steps) == len(python_steps) == 9
    assert all(torch.equal(a, b) for a, b in zip(c_steps, python_steps))
    # one C step for every batch but one that mixes a dense copy with other rows
    assert any(built) == ("delta" not in names or len(set(names)) == 1)


class View:                                                 # only what a step reads before its checks
    host_lengths = [3]


@pytest.mark.parametrize("name", ["delta", "delta-packed"])
def test_a_copy_dropped_or_made_mid_request_hands_the_step_back(int4_engine, name):
    """The step read a dense copy the cache then drops, or read packed signs of a delta the cache
    then densifies: either way the Python step serves (it reads the delta as it is now)."""
    resident = int4_engine.resident("tiny")
    delta = requests_for(int4_engine)[NAMES.index(name)].variant
    batch = RowVariants.build([delta], resident.device)
    step = c_step.FusedStep.build(resident.model, lean_llama.LeanLlama(resident.model, batch), batch)
    assert step is not None and step.copies
    module, copy = step.copies[0]
    assert (copy is None) == (name == "delta-packed")
    module.dense = None if copy is not None else object()    # dropped, or made
    try:
        assert step(torch.zeros(1, 64), torch.zeros(1, 16), torch.zeros(1, 16), View()) is False
    finally:
        module.dense = copy


def test_silu_mul_is_silu_of_the_gate_times_up():
    silu_mul = native.silu_mul_fn(40)
    gu = torch.randn(3, 80) * 8
    assert torch.allclose(silu_mul(gu), torch.nn.functional.silu(gu[:, :40]) * gu[:, 40:], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="silu_mul"):
        silu_mul(gu[:, :60].contiguous())


def test_a_batch_off_the_c_step_says_why_and_the_next_one_clears_it(int4_engine):
    resident = int4_engine.resident("tiny")
    all_requests = requests_for(int4_engine)
    variants = {name: r.variant for name, r in zip(NAMES, all_requests)}

    def run(names):
        for _ in generate(resident, [GenerationRequest(all_requests[1].input_ids, variants[n],
                                                       SamplingParams(max_tokens=3)) for n in names]):
            pass
        return decode_path(resident.model, resident.device, resident.weights).c_step_fallback

    assert "dense BitDelta copy" in run(["lora-a", "delta", "tiny"])     # the hot copy serves one row only
    assert run(["lora-a", "delta-packed", "tiny"]) is None


@pytest.mark.parametrize("count", [2, 3])
def test_the_c_steps_thread_count_changes_no_bit(int4_engine, monkeypatch, count):
    """The C kernels split each product's output rows, the sign slices' columns and the attention's
    heads over the threads (kernels/native/pool.c); every output is summed by one thread in the same
    order, so a mixed batch's logits are the same on one thread as on several."""
    from zenedge.runtime import threads

    resident = int4_engine.resident("tiny")
    all_requests = requests_for(int4_engine)
    variants = {name: r.variant for name, r in zip(NAMES, all_requests)}
    requests = [GenerationRequest(all_requests[1].input_ids, variants[name], SamplingParams(max_tokens=10))
                for name in MIXED]
    logits = {}
    for setting in (1, count):
        monkeypatch.setattr(threads, "_policy", [threads.Policy(setting, "test")])
        logits[setting], built = head_inputs(resident, requests, monkeypatch, fused=True)
        assert all(built)
    assert len(logits[1]) == 9 and all(torch.equal(a, b) for a, b in zip(logits[1], logits[count]))
