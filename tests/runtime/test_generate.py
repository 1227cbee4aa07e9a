"""Generation behaviour: greedy determinism, seeds, stop strings, max_tokens, mixed batches."""

import pytest

from zenedge.errors import AdapterNotFound, InvalidInput
from zenedge.runtime.engine import Prompt
from zenedge.runtime.generate import SamplingParams

CHAT = Prompt(messages=[{"role": "user", "content": "say something"}])


def test_greedy_is_deterministic_and_streams_the_same_text(engine, imported):
    imported("w", seed=3)
    params = SamplingParams(max_tokens=12)
    first = engine.complete("w", CHAT, params)
    second = engine.complete("w", CHAT, params)
    streamed = "".join(d.text for d in engine.stream("w", CHAT, params))
    assert first.text == second.text == streamed
    assert first.completion_tokens <= 12 and first.prompt_tokens > 0


def test_max_tokens_bounds_the_output(engine):
    out = engine.complete("tiny", CHAT, SamplingParams(max_tokens=5))
    assert out.completion_tokens <= 5
    if out.finish_reason == "length":
        assert out.completion_tokens == 5


def test_seeded_sampling_is_reproducible_and_seeds_differ(engine):
    sample = lambda seed: engine.complete("tiny", CHAT, SamplingParams(max_tokens=16, temperature=1.5, seed=seed)).text
    assert sample(1) == sample(1)
    assert len({sample(s) for s in range(4)}) > 1


def test_stop_string_truncates_and_is_never_emitted(engine):
    full = engine.complete("tiny", CHAT, SamplingParams(max_tokens=24, temperature=1.0, seed=7)).text
    assert len(full) >= 6, "need some text to cut"
    stop = full[3:5]
    cut = engine.complete("tiny", CHAT, SamplingParams(max_tokens=24, temperature=1.0, seed=7, stop=(stop,)))
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.find(stop)]
    streamed = "".join(d.text for d in engine.stream(
        "tiny", CHAT, SamplingParams(max_tokens=24, temperature=1.0, seed=7, stop=(stop,))))
    assert streamed == cut.text


def test_mixed_batch_matches_individual_greedy_runs(engine, imported):
    imported("a", seed=1)
    imported("b", seed=2)
    params = SamplingParams(max_tokens=10)
    prompts = [Prompt(messages=[{"role": "user", "content": c}]) for c in ("hello", "a much longer prompt here")]
    items = [("a", prompts[0], params), ("b", prompts[1], params), ("tiny", prompts[1], params),
             ("a", prompts[1], params)]
    batch = engine.complete_batch(items)
    for (name, prompt, p), got in zip(items, batch):
        assert got.text == engine.complete(name, prompt, p).text


def test_unknown_profile_is_an_error_not_a_fallback(engine):
    with pytest.raises(AdapterNotFound, match="zenedge pull ghost"):
        engine.complete("ghost", CHAT)


@pytest.mark.parametrize("kwargs", [{"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"stop": ("",)}])
def test_bad_sampling_params_are_refused(kwargs):
    with pytest.raises(InvalidInput):
        SamplingParams(**kwargs)


def test_bad_messages_are_refused(engine):
    with pytest.raises(InvalidInput):
        engine.complete("tiny", Prompt(messages=[{"role": "wizard", "content": "x"}]))


def test_cancelling_a_row_stops_it_and_leaves_the_others(engine):
    import threading

    from zenedge.runtime.generate import GenerationRequest, generate

    resident = engine.resident("tiny")
    ids = engine.router.route("tiny")
    prompt = CHAT.encode(resident.tokenizer)
    stop_first = threading.Event()
    requests = [GenerationRequest(prompt, None, SamplingParams(max_tokens=8), cancelled=stop_first),
                GenerationRequest(prompt, None, SamplingParams(max_tokens=8))]
    reasons, counts = {}, {0: 0, 1: 0}
    for step, deltas in enumerate(generate(resident, requests)):
        if step == 1:
            stop_first.set()
        for d in deltas:
            counts[d.index] += 1
            if d.finish_reason:
                reasons[d.index] = d.finish_reason
    assert reasons[0] == "cancelled" and counts[0] <= 3
    assert reasons.get(1) in {"length", "stop"}
