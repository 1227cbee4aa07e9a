"""POST /v1/responses with the official `openai` client's `responses` API, on the tiny random
model: text as on chat, the SDK's stream helper and the raw event order, `text.format` decoded
under its grammar, function calls and a conversation with their outputs, and the fields a
stateless server cannot honour refused by name."""

from __future__ import annotations

import json

import jsonschema
import openai
import pydantic
import pytest

from tests.conftest import make_tiny_base
from tests.server.harness import ThreadDaemon, make_home, sse_events
from tests.server.test_structured_output import SCHEMA
from tests.server.test_tool_calls import WEATHER

FUNCTIONS = [{"type": "function", "name": "weather", "description": "the forecast", "parameters": WEATHER}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """A daemon on a tiny base with room for the tools' fallback prompt (one token per character)."""
    base = make_tiny_base(tmp_path_factory.mktemp("tiny-long"), positions=2048)
    running = ThreadDaemon.start(*make_home(tmp_path_factory.mktemp("daemon"), base))
    yield running
    running.stop()


def test_text_is_what_chat_answers_and_usage_counts_it(openai_client):
    response = openai_client.responses.create(model="p0", instructions="be brief", input="tell me a story",
                                              temperature=0, max_output_tokens=16)
    chat = openai_client.chat.completions.create(
        model="p0", temperature=0, max_tokens=16,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}])
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == chat.choices[0].message.content
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"


def test_input_items_developer_and_history_render_as_chat(openai_client):
    items = [{"role": "developer", "content": "be brief"},
             {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
             {"role": "user", "content": "and?"}]
    response = openai_client.responses.create(model="p0", input=items, temperature=0, max_output_tokens=8)
    chat = openai_client.chat.completions.create(model="p0", temperature=0, max_tokens=8, messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}])
    assert response.output_text == chat.choices[0].message.content


def test_the_sdk_stream_helper_gets_the_collected_response(openai_client):
    asked = dict(model="p0", input="tell me a story", temperature=0, max_output_tokens=12)
    collected = openai_client.responses.create(**asked)
    with openai_client.responses.stream(**asked) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    final = events[-1].response   # response.completed, or (cut at the limit, as OpenAI sends it) .incomplete
    assert final.output_text == collected.output_text and final.status == collected.status
    assert final.usage.output_tokens == collected.usage.output_tokens
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{collected.status}"]


def test_raw_events_are_named_numbered_and_end_without_done(daemon):
    import httpx

    with httpx.Client(base_url=daemon.tcp_url, headers={"Authorization": f"Bearer {daemon.token}"}) as http:
        answer = http.post("/v1/responses", json={"model": "p0", "input": "hi", "stream": True,
                                                  "max_output_tokens": 6, "temperature": 0})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in answer.text.split("\n\n") if b.strip()]
    names = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    events = sse_events(answer.text.splitlines())
    assert names == [e["type"] for e in events]   # each event named by its type
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == events[-1]["response"]["output"][0]["content"][0]["text"]
    assert "[DONE]" not in answer.text


def test_text_format_json_schema_validates_and_the_parse_helper_reads_it(openai_client):
    fmt = {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}
    for seed in range(3):   # no seed on this API: sampled at temperature 1, each answer must still validate
        response = openai_client.responses.create(model="p1", input="a city as JSON", text={"format": fmt},
                                                  temperature=1.0, max_output_tokens=60)
        assert response.status == "completed", response.output_text
        jsonschema.validate(json.loads(response.output_text), SCHEMA)

    class City(pydantic.BaseModel):
        city: str = pydantic.Field(pattern="^[a-z]{1,10}$")
        rank: int = pydantic.Field(ge=0, le=99)

    parsed = openai_client.responses.parse(model="p0", input="a city", text_format=City, max_output_tokens=60)
    assert isinstance(parsed.output_parsed, City)
    json_object = openai_client.responses.create(model="p0", input="JSON", text={"format": {"type": "json_object"}},
                                                 temperature=0, max_output_tokens=60)
    assert json_object.output_text.startswith("{")


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_is_a_function_call_item_that_validates(openai_client, stream):
    asked = dict(model="p0", input="weather in oslo?", tools=FUNCTIONS, tool_choice="required", temperature=0,
                 max_output_tokens=120)
    if stream:
        with openai_client.responses.stream(**asked) as events:
            kinds = [event.type for event in events]
            response = events.get_final_response()
        assert "response.function_call_arguments.done" in kinds and "response.output_text.delta" not in kinds
    else:
        response = openai_client.responses.create(**asked)
    (call,) = response.output
    assert call.type == "function_call" and call.name == "weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert response.status == "completed"
    named = openai_client.responses.create(**{**asked, "tool_choice": {"type": "function", "name": "weather"}})
    assert named.output[0].type == "function_call" and named.output[0].name == "weather"


def test_a_required_call_wins_over_a_text_format_which_is_still_checked(openai_client):
    """instructor's Responses mode forces the call and sends its schema as text.format too."""
    fmt = {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}
    asked = dict(model="p0", input="weather in oslo?", tools=FUNCTIONS, temperature=0, max_output_tokens=120,
                 tool_choice={"type": "function", "name": "weather"})
    (call,) = openai_client.responses.create(**asked, text={"format": fmt}).output
    assert call.type == "function_call"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    with pytest.raises(openai.BadRequestError, match="uniqueItems"):
        openai_client.responses.create(**asked, text={"format": {**fmt, "schema": {"uniqueItems": True}}})


def test_a_conversation_with_a_call_and_its_output_is_answered(openai_client):
    first = openai_client.responses.create(model="p0", input="weather in oslo?", tools=FUNCTIONS,
                                           tool_choice="required", temperature=0, max_output_tokens=120)
    call = first.output[0]
    items = [{"role": "user", "content": "weather in oslo?"},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}]
    second = openai_client.responses.create(model="p0", input=items, tools=FUNCTIONS, tool_choice="none",
                                            temperature=0, max_output_tokens=8)
    assert second.output[0].type == "message" and second.status in ("completed", "incomplete")


@pytest.mark.parametrize(("extra", "named"), [
    (dict(previous_response_id="resp_1"), "previous_response_id"),
    (dict(store=True), "store"),
    (dict(top_logprobs=2), "top_logprobs"),   # without include's logprobs
    (dict(reasoning={"effort": "low"}), "reasoning"),
    (dict(text={"verbosity": "low"}), "text.verbosity"),
    (dict(extra_body={"seeed": 1}), "seeed"),
])
def test_what_a_stateless_server_cannot_honour_is_a_400_naming_it(openai_client, extra, named):
    with pytest.raises(openai.BadRequestError, match=f"`{named}`"):
        openai_client.responses.create(model="p0", input="hi", max_output_tokens=4, **extra)


def test_bad_requests_are_clear(openai_client):
    with pytest.raises(openai.BadRequestError, match="uniqueItems"):
        openai_client.responses.create(model="p0", input="hi", text={"format": {
            "type": "json_schema", "name": "x", "schema": {"type": "array", "uniqueItems": True}}})
    with pytest.raises(openai.UnprocessableEntityError, match="at least one item"):
        openai_client.responses.create(model="p0", input=[])
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.create(model="ghost", input="hi")


@pytest.mark.parametrize("stream", [False, True])
def test_a_grammar_that_admits_no_token_fails_the_response_with_its_reason(openai_client, stream):
    """The tiny tokenizer has no "é": after the opening quote the schema's grammar admits nothing."""
    asked = dict(model="p0", input="hi", max_output_tokens=8,
                 text={"format": {"type": "json_schema", "name": "x", "schema": {"enum": ["été"]}}})
    if stream:
        with openai_client.responses.stream(**asked) as events:
            response = list(events)[-1].response
    else:
        response = openai_client.responses.create(**asked)
    assert response.status == "failed" and "admits no next token" in response.error.message


def test_output_text_logprobs_collected_and_streamed(openai_client):
    asked = dict(model="p0", input="tell me a story", temperature=0, max_output_tokens=10,
                 include=["message.output_text.logprobs"], top_logprobs=2)
    part = openai_client.responses.create(**asked).output[0].content[0]
    assert part.logprobs and "".join(e.token for e in part.logprobs) == part.text   # one token per character
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in part.logprobs)   # greedy
    with openai_client.responses.stream(**asked) as stream:
        events = list(stream)
    streamed = [e for event in events if event.type == "response.output_text.delta" for e in event.logprobs]
    assert [e.token for e in streamed] == [e.token for e in part.logprobs]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in part.logprobs], abs=1e-5)
    assert events[-1].response.output[0].content[0].logprobs[-1].token == part.logprobs[-1].token
    plain = openai_client.responses.create(**{**asked, "include": None, "top_logprobs": None})
    assert not plain.output[0].content[0].logprobs
