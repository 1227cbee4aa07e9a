"""Tool calling through the daemon with the official clients, on the tiny random model: a required
or named call always parses and its arguments validate against the function's schema (sampled,
collected and streamed); "auto" returns only calls that parse and validate, else text; a history
with earlier calls and their results is accepted; bad tools are a 400 naming the problem."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.conftest import make_tiny_base
from tests.server.harness import ThreadDaemon, make_home

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "the forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "clock", "description": "the time now",
                                           "parameters": {"type": "object", "properties": {}}}}]
SCHEMAS = {"weather": WEATHER, "clock": {"type": "object", "properties": {}, "additionalProperties": False}}
ASK = [{"role": "user", "content": "weather in oslo?"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """The server conftest's daemon on a tiny base with room for the tools' prompt (its tokenizer
    has one token per character, and the fallback prompt describing TOOLS is ~700 characters)."""
    base = make_tiny_base(tmp_path_factory.mktemp("tiny-long"), positions=2048)
    running = ThreadDaemon.start(*make_home(tmp_path_factory.mktemp("daemon"), base))
    yield running
    running.stop()


def valid(call) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("model", ["tiny", "p1"])
def test_a_required_call_parses_and_validates(openai_client, model):
    for seed in range(4):
        choice = openai_client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                                       max_tokens=120, temperature=1.0, seed=seed).choices[0]
        assert choice.finish_reason == "tool_calls", choice.message.content
        assert len(choice.message.tool_calls) == 1
        valid(choice.message.tool_calls[0])


def test_a_named_call_is_that_function_and_streams_as_collected(openai_client):
    asked = dict(model="p0", messages=ASK, tools=TOOLS, max_tokens=120, temperature=0,
                 tool_choice={"type": "function", "function": {"name": "weather"}})
    collected = openai_client.chat.completions.create(**asked).choices[0]
    assert collected.finish_reason == "tool_calls" and collected.message.tool_calls[0].function.name == "weather"
    valid(collected.message.tool_calls[0])
    chunks = [c for c in openai_client.chat.completions.create(**asked, stream=True) if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    streamed = [call for c in chunks for call in c.choices[0].delta.tool_calls or []]
    assert len(streamed) == 1 and streamed[0].index == 0
    assert streamed[0].function.model_dump() == collected.message.tool_calls[0].function.model_dump()
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_returns_text_or_calls_that_validate(openai_client):
    for seed in range(4):
        choice = openai_client.chat.completions.create(model="p2", messages=ASK, tools=TOOLS, max_tokens=30,
                                                       temperature=1.0, seed=seed).choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                valid(call)
        else:
            assert isinstance(choice.message.content, str)


def test_a_history_with_calls_and_results_is_answered(openai_client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather",
                                                              "arguments": '{"city": "oslo", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    ]
    choice = openai_client.chat.completions.create(model="p0", messages=history, tools=TOOLS, tool_choice="none",
                                                   max_tokens=8, temperature=0).choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None


@pytest.mark.parametrize(("asked", "says"), [
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "nope"),
    (dict(tool_choice="required"), "needs `tools`"),
    (dict(tools=[{"type": "function", "function": {"name": "x", "parameters": {"type": "strang"}}}]), "strang"),
    (dict(tools=TOOLS, tool_choice="required",   # the call wins over a format, whose schema is still checked
          response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}), "not"),
    (dict(messages=ASK + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "weather", "arguments": "{oops"}}]}]), "not JSON"),
])
def test_bad_tools_are_a_400_naming_the_problem(openai_client, asked, says):
    with pytest.raises(openai.BadRequestError, match=says):
        openai_client.chat.completions.create(**{"model": "p0", "messages": ASK, "max_tokens": 4, **asked})


# -- Ollama's API: no tool_choice, so calls come back only when the answer is one ----------------------
OLLAMA_HISTORY = ASK + [
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "weather",
                                                                      "arguments": {"city": "oslo", "days": 1}}}]},
    {"role": "tool", "tool_name": "weather", "content": '{"sky": "clear"}'},
]


def test_ollama_calls_validate_and_history_is_accepted(ollama_client):
    for seed in range(4):
        reply = ollama_client.chat(model="p1", messages=ASK, tools=TOOLS, options={"seed": seed, "num_predict": 30})
        for call in reply.message.tool_calls or []:
            jsonschema.validate(dict(call.function.arguments), SCHEMAS[call.function.name])
        if not reply.message.tool_calls:
            assert isinstance(reply.message.content, str)
    answered = ollama_client.chat(model="p0", messages=OLLAMA_HISTORY, tools=TOOLS,
                                  options={"temperature": 0, "num_predict": 8})
    assert answered.done


def test_ollama_a_call_comes_back_as_tool_calls_streamed_as_collected(ollama_client):
    """Ollama has no tool_choice; a `format` holding the answer to a bare call object (the Llama 3
    form the parser reads) makes the tiny model write one, through the whole route."""
    call_shape = {"type": "object", "properties": {"name": {"const": "weather"}, "arguments": WEATHER},
                  "required": ["name", "arguments"]}
    asked = dict(model="p2", messages=ASK, tools=TOOLS, format=call_shape, options={"temperature": 0, "num_predict": 120})
    collected = ollama_client.chat(**asked).message
    assert collected.content == "" and len(collected.tool_calls) == 1
    jsonschema.validate(dict(collected.tool_calls[0].function.arguments), WEATHER)
    lines = list(ollama_client.chat(**asked, stream=True))
    streamed = [call for line in lines for call in line.message.tool_calls or []]
    assert "".join(line.message.content for line in lines) == ""
    assert [c.function.model_dump() for c in streamed] == [c.function.model_dump() for c in collected.tool_calls]
    assert lines[-1].done


def test_ollama_bad_tools_are_a_400_in_ollama_shape(ollama_client):
    import ollama

    bad = [{"type": "function", "function": {"name": "x", "parameters": {
        "type": "object", "properties": {"a": {"type": "strang"}}}}}]
    with pytest.raises(ollama.ResponseError, match="strang") as refused:
        ollama_client.chat(model="p0", messages=ASK, tools=bad)
    assert refused.value.status_code == 400 and isinstance(refused.value.error, str)
