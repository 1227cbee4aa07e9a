"""Structured output through the daemon, with the official clients: OpenAI's `response_format`
(json_object, json_schema) and Ollama's `format` ("json", a schema) decode under a grammar, so the
answer parses and validates on the tiny random model; streamed equals collected; a schema the
engine cannot take is a 400 naming the keyword, in each API's error shape."""

from __future__ import annotations

import json

import jsonschema
import ollama
import openai
import pydantic
import pytest

SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,10}$"}, "rank": {"type": "integer", "maximum": 99},
                         "sunny": {"type": "boolean"}},
          "required": ["city", "rank", "sunny"]}
MESSAGES = [{"role": "user", "content": "a city as JSON"}]
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}


@pytest.mark.parametrize("model", ["tiny", "p1"])
def test_openai_json_schema_validates_and_streams_the_same(openai_client, model):
    asked = dict(model=model, messages=MESSAGES, max_tokens=60, response_format=SCHEMA_FORMAT)
    for seed in range(3):
        choice = openai_client.chat.completions.create(**asked, temperature=1.0, seed=seed).choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    collected = openai_client.chat.completions.create(**asked, temperature=0).choices[0].message.content
    chunks = list(openai_client.chat.completions.create(**asked, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == collected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_openai_json_object_and_the_sdks_parse_helper(openai_client):
    answer = openai_client.chat.completions.create(model="p0", messages=MESSAGES, max_tokens=60, temperature=0.7,
                                                   seed=1, response_format={"type": "json_object"})
    choice = answer.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:   # cut at max_tokens: still the start of an object
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")

    class City(pydantic.BaseModel):
        city: str = pydantic.Field(pattern="^[a-z]{1,10}$")
        rank: int = pydantic.Field(ge=0, le=99)

    parsed = openai_client.chat.completions.parse(model="p0", messages=MESSAGES, max_tokens=60, response_format=City)
    assert isinstance(parsed.choices[0].message.parsed, City)


def test_ollama_format_schema_and_json(ollama_client):
    for seed in range(3):
        reply = ollama_client.chat(model="p2", messages=MESSAGES, format=SCHEMA,
                                   options={"seed": seed, "num_predict": 60})
        assert reply.done_reason == "stop"
        jsonschema.validate(json.loads(reply.message.content), SCHEMA)
    streamed = "".join(part.message.content for part in ollama_client.chat(
        model="p2", messages=MESSAGES, format=SCHEMA, stream=True, options={"temperature": 0, "num_predict": 60}))
    collected = ollama_client.chat(model="p2", messages=MESSAGES, format=SCHEMA,
                                   options={"temperature": 0, "num_predict": 60}).message.content
    assert streamed == collected
    generated = ollama_client.generate(model="tiny", prompt="JSON please", format="json",
                                       options={"temperature": 0, "num_predict": 60})
    assert generated.response.startswith("{")


@pytest.mark.parametrize(("schema", "keyword"), [({"type": "array", "uniqueItems": True}, "uniqueItems"),
                                                 ({"$ref": "#/$defs/gone"}, "gone"),
                                                 ({"type": "strang"}, "strang")])
def test_an_unsupported_schema_is_a_400_naming_it_on_both_apis(openai_client, ollama_client, schema, keyword):
    with pytest.raises(openai.BadRequestError, match=keyword) as refused:
        openai_client.chat.completions.create(model="p0", messages=MESSAGES, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert refused.value.body["code"] == "invalid_input"
    with pytest.raises(ollama.ResponseError, match=keyword) as refused:
        ollama_client.chat(model="p0", messages=MESSAGES, format=schema)
    assert refused.value.status_code == 400 and isinstance(refused.value.error, str)


def test_a_json_schema_format_needs_its_schema_object(openai_client):
    with pytest.raises(openai.UnprocessableEntityError, match="needs `json_schema`"):   # as any malformed body
        openai_client.chat.completions.create(model="p0", messages=MESSAGES, max_tokens=4,
                                              response_format={"type": "json_schema"})


def test_a_schema_the_vocabulary_cannot_write_ends_the_answer_with_an_error_line(openai_client, ollama_client):
    """The tiny tokenizer has no "é": the grammar admits no token after the opening quote."""
    impossible = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["été"]}}}
    choice = openai_client.chat.completions.create(model="p0", messages=MESSAGES, max_tokens=8,
                                                   response_format=impossible).choices[0]
    assert choice.finish_reason == "error" and "admits no next token" in choice.model_extra["error"]
    chunks = list(openai_client.chat.completions.create(model="p0", messages=MESSAGES, max_tokens=8, stream=True,
                                                        response_format=impossible))
    assert chunks[-1].choices[0].finish_reason == "error"
    reply = ollama_client.chat(model="p0", messages=MESSAGES, format={"enum": ["été"]})
    assert reply.done_reason == "error"
