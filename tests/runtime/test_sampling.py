"""The sampler: each filter and penalty on hand-made logits, its invariants as properties, and a
penalised or filtered row in a batch choosing what it chooses alone."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zenedge.errors import InvalidInput
from zenedge.runtime.engine import Prompt
from zenedge.runtime.sampling import MAX_TOP_LOGPROBS, Sampler, SamplingParams, TokenLogprob

CHAT = Prompt(messages=[{"role": "user", "content": "say something"}])
LOGITS = torch.tensor([4.0, 3.0, 2.0, -1.0, 0.5])   # token 0 likeliest, then 1, 2, 4, 3


def choices(params: SamplingParams, logits=LOGITS, prompt=(), answer=(), draws=200) -> set[int]:
    sampler = Sampler(params)
    return {sampler.choose(logits, list(prompt), list(answer)) for _ in range(draws)}


def test_greedy_takes_the_argmax_and_penalties_move_it():
    assert choices(SamplingParams()) == {0}
    # token 0 is in the prompt: divided by 2 it falls to 2.0, below token 1's 3.0
    assert choices(SamplingParams(repeat_penalty=2.0), prompt=[0]) == {1}
    # outside the window of the last 2 tokens, it is not penalised
    assert choices(SamplingParams(repeat_penalty=2.0, repeat_last_n=2), prompt=[0, 4, 4]) == {0}
    assert choices(SamplingParams(repeat_penalty=2.0, repeat_last_n=-1), prompt=[0, 4, 4]) == {1}
    assert choices(SamplingParams(repeat_penalty=2.0, repeat_last_n=0), prompt=[0]) == {0}
    # presence: once; frequency: per occurrence (OpenAI's), on the answer only
    assert choices(SamplingParams(presence_penalty=1.5), answer=[0]) == {1}
    assert choices(SamplingParams(presence_penalty=1.5), prompt=[0]) == {0}
    assert choices(SamplingParams(frequency_penalty=0.6), answer=[0]) == {0}
    assert choices(SamplingParams(frequency_penalty=0.6), answer=[0, 0]) == {1}
    assert choices(SamplingParams(frequency_penalty=-2.0), answer=[3]) == {0}


def test_a_negative_logit_is_multiplied_by_the_repeat_penalty():
    logits = torch.tensor([-1.0, -1.5])
    assert choices(SamplingParams(repeat_penalty=2.0), logits, prompt=[0]) == {1}   # -2.0 < -1.5


def test_filters_keep_what_they_say():
    hot = dict(temperature=5.0, seed=1)   # nearly uniform: every token shows up unless filtered
    assert choices(SamplingParams(**hot)) == {0, 1, 2, 3, 4}
    assert choices(SamplingParams(**hot, top_k=2)) == {0, 1}
    assert choices(SamplingParams(**hot, top_k=1)) == {0}
    assert choices(SamplingParams(**hot, min_p=1.0)) == {0}
    # at temperature 5: p(1)/p(0) = e^-0.2 = 0.82 and p(2)/p(0) = 0.67, p(4)/p(0) = 0.50
    assert choices(SamplingParams(**hot, min_p=0.6)) == {0, 1, 2}
    assert choices(SamplingParams(**hot, top_p=1e-6)) == {0}


def test_a_seed_reproduces_every_combination():
    params = SamplingParams(temperature=1.3, seed=11, top_k=3, min_p=0.05, top_p=0.9, repeat_penalty=1.3,
                            presence_penalty=0.4, frequency_penalty=0.2)
    draws = lambda: [Sampler(params).choose(LOGITS, [0, 1], [2, 2]) for _ in range(3)]   # noqa: E731
    assert draws() == draws()


@pytest.mark.parametrize("wrong", [dict(top_k=-1), dict(min_p=1.5), dict(repeat_penalty=0.0),
                                   dict(repeat_last_n=-2), dict(presence_penalty=2.5), dict(frequency_penalty=-3.0)])
def test_out_of_range_settings_are_refused(wrong):
    name = next(iter(wrong))
    with pytest.raises(InvalidInput, match=name):
        SamplingParams(**wrong)


@settings(max_examples=60, deadline=None)
@given(logits=st.lists(st.floats(-20, 20), min_size=2, max_size=40),
       top_k=st.integers(0, 45), min_p=st.floats(0, 1), top_p=st.floats(0.01, 1),
       seed=st.integers(0, 2**32))
def test_a_sampled_token_always_passes_the_filters(logits, top_k, min_p, top_p, seed):
    values = torch.tensor(logits)
    token = Sampler(SamplingParams(temperature=1.0, seed=seed, top_k=top_k, min_p=min_p, top_p=top_p)).choose(
        values, [], [])
    assert 0 <= token < len(logits)
    if top_k:
        assert (values > values[token]).sum() < top_k
    probs = torch.softmax(values, -1)
    assert probs[token] >= min_p * probs.max() - 1e-6


def test_a_penalised_row_chooses_the_same_alone_and_in_a_batch(engine, imported):
    imported("a", seed=1)
    prompts = [Prompt(messages=[{"role": "user", "content": c}]) for c in ("hello there", "count to ten")]
    penalised = SamplingParams(max_tokens=16, repeat_penalty=1.8, frequency_penalty=1.0)
    sampled = SamplingParams(max_tokens=16, temperature=0.9, seed=5, top_k=20, min_p=0.02, presence_penalty=0.5)
    plain = SamplingParams(max_tokens=16)
    items = [("a", prompts[0], penalised), ("tiny", prompts[1], plain), ("tiny", prompts[0], sampled),
             ("a", prompts[1], penalised)]
    batch = engine.complete_batch(items)
    for (name, prompt, params), got in zip(items, batch):
        assert got.text == engine.complete(name, prompt, params).text
    # and the penalty changes the answer (the tiny random model repeats itself greedily)
    assert engine.complete("a", prompts[0], penalised).text != engine.complete("a", prompts[0], plain).text


# -- logprobs ----------------------------------------------------------------------------------------
def test_token_logprob_is_the_log_softmax_and_ranks_the_top():
    logprob = TokenLogprob.of(LOGITS, 2, top=3)
    expected = torch.log_softmax(LOGITS, dim=-1)
    assert logprob.token == 2 and logprob.logprob == pytest.approx(float(expected[2]))
    assert [t for t, _ in logprob.top] == [0, 1, 2]
    assert [v for _, v in logprob.top] == pytest.approx(expected[[0, 1, 2]].tolist())
    assert TokenLogprob.of(LOGITS, 0, top=0).top == ()
    with pytest.raises(InvalidInput, match="top_logprobs"):
        SamplingParams(logprobs=MAX_TOP_LOGPROBS + 1)


@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_streamed_logprobs_are_the_models_own(engine, tiny_base_dir, temperature):
    """Each token's logprob is what a plain transformers forward over the prompt and the answer so
    far gives it (the model's distribution, before the temperature), and greedy's token is the top."""
    from transformers import AutoModelForCausalLM

    params = SamplingParams(max_tokens=8, temperature=temperature, seed=5, logprobs=3)
    deltas = [d for d in engine.stream("tiny", CHAT, params) if d.logprob is not None]
    assert deltas, "the answer needs tokens for this test to mean anything"
    prompt = CHAT.encode(engine.resident("tiny").tokenizer)
    answer = [d.logprob.token for d in deltas]
    assert answer == [d.token_id for d in deltas]
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(tiny_base_dir).eval()(
            input_ids=torch.tensor([prompt + answer])).logits[0]
    expected = torch.log_softmax(logits[len(prompt) - 1:-1].float(), dim=-1)
    for step, delta in enumerate(deltas):
        assert delta.logprob.logprob == pytest.approx(float(expected[step, delta.token_id]), abs=1e-4)
        top = [v for _, v in delta.logprob.top]
        assert len(top) == 3 and top == sorted(top, reverse=True)
        if temperature == 0:
            assert delta.logprob.top[0][0] == delta.token_id


def test_logprobs_off_computes_none(engine):
    assert all(d.logprob is None for d in engine.stream("tiny", CHAT, SamplingParams(max_tokens=4)))
