"""Tool calling in the runtime (runtime/tools.py), on the tiny model: the tools written into a
template that has no tool section, a required call decoded under its grammar parses and
validates whatever the weights, and what only looks like a call comes back as text."""

import json

import jsonschema
import pytest

from tests.conftest import tiny_tokenizer
from zenedge.errors import InvalidInput
from zenedge.runtime import tools
from zenedge.runtime.engine import Prompt
from zenedge.runtime.generate import SamplingParams

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,3}$"},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]


def test_a_template_without_tools_gets_them_in_a_system_message_and_history_as_hermes():
    tokenizer = tiny_tokenizer()
    assert tools.style(tokenizer) == "fallback"
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "osl"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    messages, passed = tools.messages_for_template(tokenizer, history, TOOLS)
    assert passed is None and messages[0]["role"] == "system" and '"name": "weather"' in messages[0]["content"]
    assert messages[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "weather", "arguments": '
                                                           '{"city": "osl"}}\n</tool_call>'}
    assert messages[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}


def test_a_template_that_renders_tools_gets_them_passed_on():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "{% if tools %}{{ tools | tojson }}{% endif %}" + tokenizer.chat_template
    assert tools.style(tokenizer) == "hermes"
    call = {"id": "c1", "type": "function", "function": {"name": "time", "arguments": '{"zone": "utc"}'}}
    messages, passed = tools.messages_for_template(tokenizer, [{"role": "assistant", "tool_calls": [call]}], TOOLS)
    assert passed == TOOLS
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == {"zone": "utc"}


@pytest.mark.parametrize("only", [None, "weather"])
def test_a_required_call_parses_and_validates_whatever_the_weights(engine, only):
    resident = engine.resident("tiny")
    grammar = tools.call_grammar(TOOLS, only)
    for seed in range(4):
        params = SamplingParams(max_tokens=120, temperature=1.0, seed=seed, grammar=grammar)
        out = engine.complete("tiny", Prompt(messages=[{"role": "user", "content": "call"}]), params)
        content, calls = tools.parse(out.text, TOOLS, resident.tokenizer)
        assert out.finish_reason == "stop" and content == "" and len(calls) == 1, out.text
        spec = {"weather": WEATHER, "time": TIME}[calls[0].name]
        jsonschema.validate(calls[0].arguments, spec["function"]["parameters"])
        assert only in (None, calls[0].name)


@pytest.mark.parametrize("text", [
    "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",   # days missing
    "<tool_call>\n{\"name\": \"ghost\", \"arguments\": {}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"time\", \"arguments\": {\"zone\": \"utc\"}",                      # unclosed
    "<tool_call>{not json}</tool_call>",
    "{\"city\": \"Oslo\"}",
    "just words",
])
def test_what_only_looks_like_a_call_is_text(text):
    assert tools.parse(text, TOOLS, tiny_tokenizer()) == (text, [])


def test_calls_in_each_style_are_read():
    tokenizer = tiny_tokenizer()
    hermes = 'Let me look.\n<tool_call>\n{"name": "time", "arguments": {"zone": "cet"}}\n</tool_call>'
    assert tools.parse(hermes, TOOLS, tokenizer) == ("Let me look.", [tools.Call("time", {"zone": "cet"})])
    llama3 = json.dumps({"name": "weather", "parameters": {"city": "rom", "days": 2}})
    assert tools.parse(llama3, TOOLS, tokenizer) == ("", [tools.Call("weather", {"city": "rom", "days": 2})])


def test_a_named_choice_must_be_offered():
    with pytest.raises(InvalidInput, match="'nope'"):
        tools.call_grammar(TOOLS, "nope")


CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "osl", "days": 2}}\n</tool_call>'


@pytest.mark.parametrize("text", [
    "Let me look. " + CALL,
    CALL,
    '{"name": "time", "parameters": {"zone": "utc"}}',
    "no call at all, just < and <tool words",
    "<tool_call>\n{\"name\": \"ghost\", \"arguments\": {}}\n</tool_call>",
    '  {"not": "a call"}',
])
@pytest.mark.parametrize("piece", [1, 3, 7, 1000])
def test_a_streamed_answer_reads_as_parse_of_the_whole(text, piece):
    """However the text is cut, what CallStream sends is the answer's text when it holds no call,
    or the text before the calls and then the calls `parse` finds."""
    tokenizer = tiny_tokenizer()
    stream = tools.CallStream(TOOLS, tokenizer)
    sent = "".join(stream.feed(text[i:i + piece]) for i in range(0, len(text), piece))
    rest, calls = stream.finish()
    content, expected = tools.parse(text, TOOLS, tokenizer)
    assert calls == expected
    if calls:
        assert rest == "" and sent.strip() == content and no_call_in(sent)
    else:
        assert sent + rest == text


def no_call_in(text: str) -> bool:
    return tools.HERMES_OPEN not in text and "{" not in text
