"""The official `ollama` Python client against a live daemon on loopback TCP (bearer token sent
through the client's `headers`, as Hanzo Desktop's node would): list, show, chat, generate,
embed, pull, delete, ps, and the errors Ollama's clients expect."""

from __future__ import annotations

import json
import math
import time

import httpx
import ollama
import pytest

from tests.server.harness import PROFILES, chat_body
from zenedge.api import wire

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}]
GREEDY = {"temperature": 0, "num_predict": 12}


def client_for(daemon, token: str | None = "<own>") -> ollama.Client:
    token = daemon.token if token == "<own>" else token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return ollama.Client(host=daemon.tcp_url, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def client(daemon):
    return client_for(daemon)


def test_list_shows_bases_and_profiles(client):
    models = {m.model: m for m in client.list().models}
    assert {"tiny", "forever", *PROFILES} <= set(models)
    base, profile = models["tiny"], models["p0"]
    assert base.details.family == "llama" and base.details.format == "safetensors"
    assert base.details.parent_model == "" and profile.details.parent_model == "tiny"
    assert base.details.quantization_level == "F32" and base.details.parameter_size.endswith("K")
    assert profile.size > 0 and len(profile.digest) == 64 and profile.modified_at is not None


def test_show_reports_embedding_and_context_length_and_what_serves_a_profile(client, daemon):
    shown = client.show("p1")
    assert shown.modelinfo["llama.embedding_length"] == 64 and shown.modelinfo["llama.context_length"] == 128
    assert shown.capabilities == ["completion", "embedding"]
    assert shown.modelinfo["zenedge.kind"] == "lora" and shown.modelinfo["zenedge.base"] == "tiny"
    assert shown.details.parent_model == "tiny" and "<|im_start|>" in shown.template
    listed = {m["name"]: m for m in httpx.get(f"{daemon.tcp_url}/api/list",
                                              headers={"Authorization": f"Bearer {daemon.token}"}).json()["models"]}
    assert listed["p1"]["served_by"] == shown.modelinfo["zenedge.adapter"][:12]
    base = client.show("tiny:latest")  # Ollama's clients add the tag; zenedge names have none
    assert base.modelinfo["zenedge.kind"] == "base" and base.details.parent_model == ""
    assert base.modelinfo["general.parameter_count"] > 0


def test_version(daemon):
    from zenedge import __version__

    answer = httpx.get(f"{daemon.tcp_url}/api/version", headers={"Authorization": f"Bearer {daemon.token}"})
    assert answer.json() == {"version": __version__}


@pytest.mark.parametrize("model", ["p1", "tiny"])
def test_chat_plain_and_streamed_match_the_openai_route(client, daemon, model):
    plain = client.chat(model=model, messages=MESSAGES, options=GREEDY)
    assert plain.done and plain.done_reason in ("stop", "length") and plain.message.role == "assistant"
    assert 0 < plain.eval_count <= 12 and plain.prompt_eval_count > 0
    assert all(isinstance(getattr(plain, k), int) and getattr(plain, k) >= 0 for k in
               ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"))
    assert plain.total_duration >= plain.load_duration
    parts = list(client.chat(model=model, messages=MESSAGES, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == plain.message.content
    assert (parts[-1].done_reason, parts[-1].eval_count) == (plain.done_reason, plain.eval_count)
    with daemon.uds() as http:  # the same scheduler and sampling as /v1
        openai_text = http.post("/v1/chat/completions", json={"model": model, "messages": MESSAGES,
                                                               "temperature": 0, "max_tokens": 12}).json()
    assert openai_text["choices"][0]["message"]["content"] == plain.message.content


def test_generate_templated_raw_and_streamed(client, daemon):
    templated = client.generate(model="p2", prompt="tell me a story", system="be brief", options=GREEDY)
    as_chat = client.chat(model="p2", messages=MESSAGES, options=GREEDY)
    assert templated.response == as_chat.message.content and templated.done
    raw = client.generate(model="p2", prompt="Once upon a time", raw=True, options=GREEDY)
    with daemon.uds() as http:
        completion = http.post("/v1/completions", json={"model": "p2", "prompt": "Once upon a time",
                                                        "temperature": 0, "max_tokens": 12}).json()
    assert raw.response == completion["choices"][0]["text"]
    parts = list(client.generate(model="p2", prompt="Once upon a time", raw=True, options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == raw.response and parts[-1].done


def test_options_map_onto_sampling(client):
    limited = client.generate(model="forever", prompt="go", options={"num_predict": 5, "temperature": 0})
    assert (limited.done_reason, limited.eval_count) == ("length", 5)  # `forever` never emits its end token
    sample = lambda seed: client.chat(model="p0", messages=MESSAGES,  # noqa: E731
                                      options={"temperature": 1.2, "seed": seed, "num_predict": 24}).message.content
    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(4)}) > 1
    # a seed whose sample has text to cut (a tiny random model may sample its end token first)
    seed, text = next((seed, text) for seed in range(3, 20) if len(text := sample(seed)) >= 4)
    stop = text[2:4]
    cut = client.chat(model="p0", messages=MESSAGES,
                      options={"temperature": 1.2, "seed": seed, "num_predict": 24, "stop": [stop]})
    assert cut.done_reason == "stop" and cut.message.content == text[: text.find(stop)]


def test_empty_requests_load_and_unload(client, daemon):
    loaded = client.generate(model="p3", prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    names = [m.model for m in client.ps().models]
    assert "p3" in names and "tiny" in names
    unloaded = client.chat(model="p3", messages=[], keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert "p3" not in [m.model for m in client.ps().models]


def test_keep_alive_zero_drops_the_variant_after_the_request(client):
    client.chat(model="p2", messages=MESSAGES, options={"num_predict": 2}, keep_alive="5m")
    assert "p2" in [m.model for m in client.ps().models]
    list(client.chat(model="p2", messages=MESSAGES, options={"num_predict": 2}, keep_alive=0, stream=True))
    assert "p2" not in [m.model for m in client.ps().models]
    client.embed(model="p2", input="hello", keep_alive=0)
    assert "p2" not in [m.model for m in client.ps().models]
    with pytest.raises(ollama.ResponseError) as bad:
        client.chat(model="p2", messages=MESSAGES, keep_alive="soon")
    assert bad.value.status_code == 400 and "keep_alive" in bad.value.error


def test_ps_answers_both_shapes_in_one_body(client, daemon):
    client.chat(model="p0", messages=MESSAGES, options={"num_predict": 2})
    running = {m.model: m for m in client.ps().models}
    assert running["tiny"].context_length == 128 and running["tiny"].size_vram == 0
    assert running["p0"].details.parent_model == "tiny" and running["p0"].size > 0
    with daemon.uds() as http:
        native = wire.Ps.model_validate(http.get("/api/ps").json())
    variant = next(v for v in native.variants if "p0" in v.names)
    assert running["p0"].digest == variant.key and running["p0"].size == variant.bytes


def test_embed_gives_unit_vectors_per_profile(client):
    both = client.embed(model="p0", input=["hello there", "general kenobi"])
    assert len(both.embeddings) == 2 and all(len(v) == 64 for v in both.embeddings)
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-5) for v in both.embeddings)
    assert both.prompt_eval_count == len("hello there") + len("general kenobi")  # one token per character
    one = client.embed(model="p0", input="general kenobi")
    assert one.embeddings[0] == pytest.approx(both.embeddings[1], abs=1e-5)
    base = client.embed(model="tiny", input="general kenobi")
    assert base.embeddings[0] != pytest.approx(one.embeddings[0], abs=1e-3)  # the variant is applied
    short = client.embed(model="p0", input="general kenobi", dimensions=16)
    assert len(short.embeddings[0]) == 16
    assert math.isclose(math.fsum(x * x for x in short.embeddings[0]), 1.0, rel_tol=1e-5)
    assert client.embed(model="p0", input="").embeddings == []


def test_embeddings_beside_a_running_generation_change_neither(client):
    """Embeddings run on their own thread on the same resident model as the scheduler's batches:
    each thread's variant selection must stay its own."""
    request = {"model": "forever", "messages": MESSAGES, "options": {"num_predict": 200, "temperature": 0}}
    alone_text = client.chat(**request).message.content
    alone_vectors = client.embed(model="p1", input=["hello there", "general kenobi"]).embeddings
    stream = client.chat(**request, stream=True)
    parts = [next(stream).message.content]  # the generation is running now
    during = [client.embed(model="p1", input=["hello there", "general kenobi"]).embeddings for _ in range(3)]
    parts += [part.message.content for part in stream]
    assert "".join(parts) == alone_text
    for vectors in during:
        assert vectors == [pytest.approx(v, abs=1e-6) for v in alone_vectors]


def test_node_style_embeddings_request(daemon):
    """What a Hanzo/Shinkai node sends to its embeddings_server_url: POST /api/embeddings."""
    headers = {"Authorization": f"Bearer {daemon.token}"}
    answer = httpx.post(f"{daemon.tcp_url}/api/embeddings", json={"model": "p1", "prompt": "hello"}, headers=headers)
    assert answer.status_code == 200
    vector = answer.json()["embedding"]
    batch = httpx.post(f"{daemon.tcp_url}/api/embed", json={"model": "p1", "input": ["hello"]}, headers=headers)
    assert vector == pytest.approx(batch.json()["embeddings"][0], abs=1e-6) and len(vector) == 64
    empty = httpx.post(f"{daemon.tcp_url}/api/embeddings", json={"model": "p1", "prompt": ""}, headers=headers)
    assert empty.json() == {"embedding": []}


def test_unknown_models_are_404_with_ollamas_error_body(client, daemon):
    calls = [lambda: client.chat(model="ghost", messages=MESSAGES),
             lambda: list(client.chat(model="ghost", messages=MESSAGES, stream=True)),
             lambda: client.generate(model="ghost", prompt="hi"),
             lambda: client.embed(model="ghost", input="hi"),
             lambda: client.show("ghost"),
             lambda: client.delete("ghost"),
             lambda: client.chat(model="Not A Name!", messages=MESSAGES)]
    for call in calls:
        with pytest.raises(ollama.ResponseError) as missing:
            call()
        assert missing.value.status_code == 404 and isinstance(missing.value.error, str)
        assert "ghost" in missing.value.error or "Not A Name" in missing.value.error


@pytest.mark.parametrize("call", [
    lambda c: c.chat(model="p0", messages=MESSAGES, format={"type": "array", "uniqueItems": True}),
    lambda c: c.chat(model="p0", messages=MESSAGES, think=True),
    lambda c: c.chat(model="p0", messages=[{"role": "user", "content": "hi", "images": ["aGk="]}]),
    lambda c: c.chat(model="p0", messages=MESSAGES, tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strang"}}}}}]),
    lambda c: c.generate(model="p0", prompt="hi", suffix="end"),
    lambda c: c.generate(model="p0", prompt="hi", options={"temperature": -1}),
    lambda c: c.chat(model="p0", messages=[{"role": "assistant", "content": "hi", "thinking": "hmm"}]),
    lambda c: c.embed(model="p0", input=["fine", ""]),
    lambda c: c.embed(model="p0", input="x" * 300, truncate=False),
    lambda c: c.embed(model="p0", input="hello", dimensions=65),
], ids=["unsupported-schema", "think", "images", "tools", "suffix", "temperature", "thinking", "empty-input", "too-long",
        "dimensions"])
def test_what_zenedge_cannot_honour_is_a_400(client, call):
    with pytest.raises(ollama.ResponseError) as refused:
        call(client)
    assert refused.value.status_code == 400 and isinstance(refused.value.error, str) and refused.value.error


def test_long_inputs_are_truncated_by_default(client):
    """Ollama's `truncate` defaults to true: the text is cut at the context length (128 here)."""
    cut = client.embed(model="p0", input="x" * 300)
    assert cut.prompt_eval_count == 128
    assert cut.embeddings == client.embed(model="p0", input="x" * 128).embeddings


def test_auth_and_host_rules_are_the_openai_routes_rules(daemon):
    for token in (None, "wrong"):
        with pytest.raises(ollama.ResponseError) as refused:
            client_for(daemon, token).list()
        assert refused.value.status_code == 401
    foreign = httpx.get(f"{daemon.tcp_url}/api/tags", headers={"Authorization": f"Bearer {daemon.token}",
                                                                 "Host": "evil.example"})
    assert foreign.status_code == 403
    with daemon.uds() as http:  # the socket needs no token, as for /v1
        assert http.get("/api/tags").status_code == 200


def test_leaving_a_stream_cancels_the_generation(client, daemon):
    with daemon.uds() as http:
        before = http.get("/api/ps").json()["scheduler"]["cancelled"]
    stream = client.chat(model="forever", messages=MESSAGES, options={"num_predict": 60000}, stream=True)
    next(stream)
    stream.close()
    with daemon.uds() as http:
        for _ in range(600):
            stats = http.get("/api/ps").json()["scheduler"]
            if stats["cancelled"] > before and stats["running"] == 0:
                break
            time.sleep(0.05)
        assert stats["cancelled"] > before and stats["running"] == 0


def test_pull_with_progress_then_chat(fresh_daemon, registry):
    daemon = fresh_daemon(config={"registry": {"urls": [registry]}})
    client = client_for(daemon)
    progress = list(client.pull("writer", stream=True))
    assert progress[-1].status == "success"
    downloading = [p for p in progress if p.status == "downloading"]
    assert downloading and all(isinstance(p.total, int) and 0 <= p.completed <= p.total for p in downloading)
    assert downloading[-1].completed == downloading[-1].total
    assert client.chat(model="writer", messages=MESSAGES, options={"num_predict": 3}).done
    assert client.pull("writer:latest").status == "success"  # stream=False: one object; already there
    with pytest.raises(ollama.ResponseError) as missing:
        client.pull("ghost")
    assert missing.value.status_code == 404 and isinstance(missing.value.error, str)
    with pytest.raises(ollama.ResponseError) as missing:
        list(client.pull("ghost", stream=True))
    assert missing.value.status_code == 404 and "ghost" in missing.value.error


def test_delete_removes_a_profile_and_refuses_a_base(fresh_daemon):
    daemon = fresh_daemon()
    client = client_for(daemon)
    client.chat(model="p1", messages=MESSAGES, options={"num_predict": 2})
    assert client.delete("p1").status == "success"
    assert "p1" not in [m.model for m in client.list().models]
    assert "p1" not in [m.model for m in client.ps().models]  # its variant left memory too
    with pytest.raises(ollama.ResponseError) as gone:
        client.chat(model="p1", messages=MESSAGES)
    assert gone.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as base:
        client.delete("tiny")
    assert base.value.status_code == 400 and "base" in base.value.error
    assert "tiny" in [m.model for m in client.list().models]


def test_malformed_bodies_are_400_in_ollamas_shape(daemon):
    headers = {"Authorization": f"Bearer {daemon.token}"}
    unparsable = [b"[" * 100_000 + b"]" * 100_000,  # JSON nested too deep for the parser (FastAPI: a bare 400)
                  b'{"model": "p0", "messages": [{"role": "user", "content": "\xff\xfe"}]}']  # not UTF-8
    for body in (b"{not json", json.dumps({"messages": MESSAGES}).encode(), *unparsable):
        answer = httpx.post(f"{daemon.tcp_url}/api/chat", content=body, headers=headers)
        assert answer.status_code == 400 and isinstance(answer.json()["error"], str)
    # OpenAI's fields sent to Ollama's route: Ollama ignores them, so the answer would not be capped
    # at max_tokens nor greedy; zenedge names the first one instead.
    chat = httpx.post(f"{daemon.tcp_url}/api/chat", json={**chat_body("p0", "hi"), "stream": False}, headers=headers)
    assert chat.status_code == 400 and "`max_tokens` is not a field" in chat.json()["error"]


def test_logprobs_on_chat_and_generate_collected_and_streamed(client):
    greedy = {"temperature": 0, "num_predict": 10}
    answer = client.chat(model="p0", messages=MESSAGES, options=greedy, logprobs=True, top_logprobs=2)
    entries = answer.logprobs
    assert entries and "".join(e.token for e in entries) == answer.message.content   # one token per character
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token
    streamed = [e for line in client.chat(model="p0", messages=MESSAGES, options=greedy, logprobs=True,
                                          top_logprobs=2, stream=True) for e in line.logprobs or []]
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-5)
    generated = client.generate(model="p0", prompt="tell me a story", options=greedy, logprobs=True)
    assert "".join(e.token for e in generated.logprobs) == generated.response
    assert all(not e.top_logprobs for e in generated.logprobs)
    assert client.chat(model="p0", messages=MESSAGES, options=greedy).logprobs is None
