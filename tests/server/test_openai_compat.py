"""The official `openai` package against the daemon, over TCP + token and over the Unix socket."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.harness import PROFILES, sse_events

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}]


@pytest.fixture(params=["tcp", "unix"])
def client(request, daemon):
    if request.param == "tcp":
        yield openai.OpenAI(base_url=f"{daemon.tcp_url}/v1", api_key=daemon.token, max_retries=0)
    else:
        transport = httpx.HTTPTransport(uds=str(daemon.socket))
        with httpx.Client(transport=transport) as http:
            yield openai.OpenAI(base_url="http://localhost/v1", api_key="unused-over-the-socket",
                                http_client=http, max_retries=0)


def test_models_lists_profiles_and_bases(client):
    listed = {m.id: m for m in client.models.list().data}
    assert set(PROFILES) | {"tiny"} <= set(listed)
    assert listed["tiny"].kind == "base" and listed["p0"].kind == "lora" and listed["p0"].base == "tiny"


@pytest.mark.parametrize("model", ["p1", "tiny"])
def test_chat_stream_equals_plain_at_temperature_0(client, model):
    plain = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=24)
    choice = plain.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert plain.usage.completion_tokens <= 24 and plain.usage.prompt_tokens > 0
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=24,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == choice.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == plain.usage.model_dump()


def test_text_completions_plain_and_streamed(client):
    plain = client.completions.create(model="p2", prompt="Once upon a time", temperature=0, max_tokens=16)
    assert plain.usage.completion_tokens <= 16
    chunks = list(client.completions.create(model="p2", prompt="Once upon a time", temperature=0, max_tokens=16,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk


def test_profiles_are_different_variants(client):
    texts = {m: client.chat.completions.create(model=m, messages=MESSAGES, temperature=0, max_tokens=24)
             .choices[0].message.content for m in (*PROFILES, "tiny")}
    assert len(set(texts.values())) > 1, texts


def test_sampling_seed_stop_and_token_limits(client):
    sample = lambda seed: client.chat.completions.create(  # noqa: E731
        model="p0", messages=MESSAGES, temperature=1.2, seed=seed, max_tokens=24).choices[0].message.content
    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(4)}) > 1
    limited = client.chat.completions.create(model="p0", messages=MESSAGES, temperature=0, max_completion_tokens=3,
                                             max_tokens=50)
    assert limited.usage.completion_tokens <= 3  # max_completion_tokens wins over max_tokens
    full = client.chat.completions.create(model="p0", messages=MESSAGES, temperature=1.0, seed=3, max_tokens=48)
    text = full.choices[0].message.content
    assert len(text) >= 4, "need some text to cut"
    stop = text[2:4]
    cut = client.chat.completions.create(model="p0", messages=MESSAGES, temperature=1.0, seed=3, max_tokens=48,
                                         stop=[stop, "never-there"])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].message.content == text[: text.find(stop)]
    as_string = client.chat.completions.create(model="p0", messages=MESSAGES, temperature=1.0, seed=3, max_tokens=48,
                                               stop=stop)
    assert as_string.choices[0].message.content == cut.choices[0].message.content


def test_unknown_model_is_a_404_not_a_fallback(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="ghost", messages=MESSAGES, max_tokens=4)
    assert caught.value.body["code"] == "adapter_not_found"


def test_content_parts_and_raw_sse_framing(daemon):
    parts = [{"role": "user", "content": [{"type": "text", "text": "tell me "}, {"type": "text", "text": "a story"}]}]
    body = {"model": "p0", "temperature": 0, "max_tokens": 8}
    with daemon.uds() as http:
        joined = http.post("/v1/chat/completions", json={**body, "messages": parts}).json()
        plain = http.post("/v1/chat/completions",
                          json={**body, "messages": [{"role": "user", "content": "tell me a story"}]}).json()
        assert joined["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
        with http.stream("POST", "/v1/chat/completions", json={**body, "messages": parts, "stream": True}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = sse_events(response.iter_lines())
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert streamed == plain["choices"][0]["message"]["content"]


def test_chat_logprobs_plain_and_streamed(client):
    asked = dict(model="p0", messages=MESSAGES, temperature=0, max_tokens=10, logprobs=True, top_logprobs=2)
    plain = client.chat.completions.create(**asked).choices[0]
    entries = plain.logprobs.content
    assert entries and "".join(e.token for e in entries) == plain.message.content   # a character-level vocabulary
    for entry in entries:
        assert entry.logprob <= 0 and bytes(entry.bytes).decode() == entry.token
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token   # greedy: the top
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    chunks = list(client.chat.completions.create(**asked, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-5)
    assert client.chat.completions.create(**{**asked, "logprobs": False, "top_logprobs": None}
                                          ).choices[0].logprobs is None


def test_n_choices_are_seeded_per_index_and_stream_by_index(client):
    asked = dict(model="p0", messages=MESSAGES, temperature=1.2, max_tokens=12)
    three = client.chat.completions.create(**asked, seed=11, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    texts = [c.message.content for c in three.choices]
    alone = [client.chat.completions.create(**asked, seed=seed) for seed in (11, 12)]
    assert texts[:2] == [a.choices[0].message.content for a in alone]   # choice i samples as seed + i would
    assert len(set(texts)) > 1
    assert three.usage.prompt_tokens == alone[0].usage.prompt_tokens   # the prompt counts once, as OpenAI's does
    assert three.usage.completion_tokens <= 3 * 12
    chunks = list(client.chat.completions.create(**asked, seed=11, n=3, stream=True))
    joined = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
              for i in range(3)}
    assert [joined[i] for i in range(3)] == texts
    assert all(any(c.choices and c.choices[0].index == i and c.choices[0].finish_reason for c in chunks)
               for i in range(3))
    with pytest.raises(openai.UnprocessableEntityError, match="n: Input should be less than or equal to 8"):
        client.chat.completions.create(**asked, n=99)


def test_text_completion_logprobs_and_n(client):
    answer = client.completions.create(model="p0", prompt="once upon", temperature=0, max_tokens=8, logprobs=2, n=2)
    assert [c.index for c in answer.choices] == [0, 1] and answer.choices[0].text == answer.choices[1].text
    logprobs = answer.choices[0].logprobs
    assert "".join(logprobs.tokens) == answer.choices[0].text
    assert len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == len(logprobs.tokens)
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    assert all(len(top) <= 2 and max(top.values()) <= 0 for top in logprobs.top_logprobs)
