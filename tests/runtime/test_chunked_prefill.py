"""Long prompts: prefilled in chunks (the same logits as one forward, within fp32 rounding, and the
same greedy tokens), with other rows decoding between the chunks and rows joining mid-batch (their
tokens counted before the long prompt's first, never timed), memory per chunk bounded, and the
context's limit: a prompt that leaves no room refused before anything is allocated, generation
stopped at the context's end."""

import pytest
import torch

from zenedge.errors import ContextLengthExceeded, InvalidInput
from zenedge.runtime import decode, generate as generate_module, static_cache
from zenedge.runtime.engine import Prompt
from zenedge.runtime.generate import GenerationRequest, SamplingParams, check_fits, generate
from zenedge.runtime.layers import RowVariants

CHUNK = 8


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", CHUNK)


@pytest.fixture
def variants(engine, imported):
    imported("lora", seed=1)
    return {"tiny": None, "lora": engine.variant(engine.router.route("lora"))}


def ids(n: int, seed: int = 0) -> list[int]:
    return torch.randint(3, 90, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def events(resident, requests, **kwargs) -> list[tuple[int, int | None]]:
    """(request index, token id) of every delta, in the order generate() yields them."""
    return [(d.index, d.token_id) for deltas in generate(resident, requests, **kwargs) for d in deltas]


def tokens_of(stream, index: int) -> list[int | None]:
    return [token for i, token in stream if i == index]


@pytest.mark.parametrize("name", ["tiny", "lora"])
def test_a_chunked_prefill_gives_one_forwards_logits_and_tokens(engine, variants, name, monkeypatch):
    resident = engine.resident("tiny")
    prompt = ids(100)
    batch = RowVariants.build([variants[name]], resident.device)
    logits = {}
    for chunk in (100, 32, 7, 1):
        with decode.open_stepper(resident, batch, len(prompt), 4) as stepper:
            logits[chunk] = [stepper.prefill(0, prompt[i:i + chunk]) for i in range(0, len(prompt), chunk)][-1]
    for chunk in (32, 7, 1):   # other matmul and attention shapes: fp32 rounding apart, no more
        torch.testing.assert_close(logits[chunk], logits[100], rtol=0, atol=1e-5 * logits[100].abs().max().item())
    request = [GenerationRequest(prompt, variants[name], SamplingParams(max_tokens=20))]
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", 1000)
    whole = events(resident, request)
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", 7)
    assert events(resident, request) == whole and len(whole) >= 4


def test_a_short_request_gets_tokens_while_a_long_prompt_prefills(engine, variants, small_chunks):
    resident = engine.resident("tiny")
    long = GenerationRequest(ids(100), variants["lora"], SamplingParams(max_tokens=6))
    short = GenerationRequest(ids(5, seed=1), None, SamplingParams(max_tokens=40))
    stream = events(resident, [long, short])
    first_long = next(n for n, (i, _) in enumerate(stream) if i == 0)
    before = [i for i, _ in stream[:first_long]]
    assert before.count(1) >= 100 // CHUNK - 1          # a token per chunk of the long prompt, about
    assert tokens_of(stream, 0) == tokens_of(events(resident, [long]), 0)      # each as it is alone
    assert tokens_of(stream, 1) == tokens_of(events(resident, [short]), 0)


def test_a_request_that_joins_starts_at_the_next_tick(engine, variants, small_chunks):
    """The daemon's scheduler hands requests over between ticks (`admit`): one that arrives while
    a long prompt prefills gets its tokens before that prompt's first, in a free slot or a new one."""
    resident = engine.resident("tiny")
    long = GenerationRequest(ids(100), None, SamplingParams(max_tokens=6))
    short = GenerationRequest(ids(5, seed=1), variants["lora"], SamplingParams(max_tokens=3))
    later = GenerationRequest(ids(9, seed=2), None, SamplingParams(max_tokens=3))
    handed = iter([[], [short], [], [], [], [], [], [later]])
    stream = events(resident, [long], admit=lambda: next(handed, []))
    first_long = next(n for n, (i, _) in enumerate(stream) if i == 0)
    assert tokens_of(stream[:first_long], 1) == tokens_of(events(resident, [short]), 0)   # all of it, first
    assert tokens_of(stream, 2) == tokens_of(events(resident, [later]), 0)                # after short left
    assert tokens_of(stream, 0) == tokens_of(events(resident, [long]), 0)


def test_a_stream_of_short_prompts_does_not_starve_a_long_one(engine, small_chunks):
    """Short prompts go first, but a prompt passed over in one tick goes first in the next: with a
    new short request every tick, the long prompt still takes a chunk every other tick."""
    resident = engine.resident("tiny")
    long = GenerationRequest(ids(100), None, SamplingParams(max_tokens=2))
    shorts = iter([[GenerationRequest(ids(5, seed=s), None, SamplingParams(max_tokens=1))] for s in range(60)])
    stream = events(resident, [long], admit=lambda: next(shorts, []))
    first_long = next(n for n, (i, _) in enumerate(stream) if i == 0)
    served_before = len({i for i, _ in stream[:first_long]})
    assert served_before <= 2 * -(-100 // CHUNK) + 1          # about one short per tick, two ticks a chunk
    assert tokens_of(stream, 0) == tokens_of(events(resident, [long]), 0)


def test_a_chunk_never_builds_more_than_its_own_mask(engine, small_chunks, monkeypatch):
    resident = engine.resident("tiny")
    shapes = []
    chunk = static_cache.StaticKVCache.chunk

    def spy(cache, row, width):
        made = chunk(cache, row, width)
        shapes.append(tuple(made[1].shape))
        return made

    monkeypatch.setattr(static_cache.StaticKVCache, "chunk", spy)
    events(resident, [GenerationRequest(ids(100), None, SamplingParams(max_tokens=2))])
    assert len(shapes) == -(-100 // CHUNK) and max(rows for _, _, rows, _ in shapes) == CHUNK
    assert shapes[-1] == (1, 1, 100 % CHUNK, 100)          # the last chunk's queries over the whole prompt


def test_a_prompt_that_leaves_no_room_is_refused_before_anything_is_allocated(engine):
    resident = engine.resident("tiny")
    resident.kv_pool.release()
    context = resident.context_length
    assert context == 128
    with pytest.raises(ContextLengthExceeded) as refused:
        list(generate(resident, [GenerationRequest(ids(5), None), GenerationRequest(ids(context), None)]))
    assert str(refused.value).startswith(f"the prompt is {context} tokens and tiny's context length is {context}")
    assert refused.value.exit_code == 2 and refused.value.http_status == 400
    assert resident.kv_pool.idle_bytes == 0                # no cache was ever checked out
    with pytest.raises(ContextLengthExceeded, match="10,000 tokens"):
        engine.complete("tiny", Prompt(text="x" * 10_000))
    with pytest.raises(InvalidInput, match="empty prompt"):
        check_fits(resident, [])


def test_generation_stops_at_the_end_of_the_context(engine):
    resident = engine.resident("tiny")
    eos_free = type(resident)(**{**vars(resident), "eos_ids": (-1,)})        # never stops on its own
    stream = events(eos_free, [GenerationRequest(ids(120), None, SamplingParams(max_tokens=50)),
                               GenerationRequest(ids(10), None, SamplingParams(max_tokens=50))])
    assert len(tokens_of(stream, 0)) == 128 - 120 and len(tokens_of(stream, 1)) == 50
    reasons = [d.finish_reason for deltas in generate(eos_free, [GenerationRequest(ids(127), None)]) for d in deltas]
    assert reasons == ["length"]                           # one token fits: it comes
