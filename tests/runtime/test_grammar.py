"""Constrained decoding on the tiny random model: whatever its weights say, the output parses and
validates; a row's greedy output is the same alone and in a mixed batch; bad schemas are refused
before any work, naming the keyword; a grammar with no admissible token ends its row alone."""

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zenedge.errors import InvalidInput
from zenedge.runtime.engine import Prompt
from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
from zenedge.runtime.grammar import SAFE_INTEGER, Grammar, tightened

CHAT = Prompt(messages=[{"role": "user", "content": "describe a person as JSON"}])
PERSON = {"type": "object",   # bounded, so that a random model ends within the tiny context
          "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 2},
                         "home": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,4}$"}},
                                  "required": ["city"]}},
          "required": ["name", "age", "tags", "home"]}


def constrained(schema=PERSON, **kwargs) -> SamplingParams:
    return SamplingParams(max_tokens=kwargs.pop("max_tokens", 120),
                          grammar=Grammar.json_schema(schema, "response_format"), **kwargs)


def test_greedy_output_parses_and_validates(engine):
    out = engine.complete("tiny", CHAT, constrained())
    assert out.finish_reason == "stop", out
    jsonschema.validate(json.loads(out.text), PERSON)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31), temperature=st.floats(0.5, 2.0))
def test_sampled_output_validates_whatever_the_seed(engine, seed, temperature):
    out = engine.complete("tiny", CHAT, constrained(temperature=temperature, seed=seed, top_p=0.95))
    assert out.finish_reason == "stop", out
    jsonschema.validate(json.loads(out.text), PERSON)


def test_json_object_mode_gives_an_object(engine):
    params = SamplingParams(max_tokens=60, grammar=Grammar.json_object("response_format"), temperature=1.0, seed=3)
    out = engine.complete("tiny", CHAT, params)
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)
    else:   # cut at max_tokens: still a prefix of an object
        assert out.finish_reason == "length" and out.text.startswith("{")


def test_a_row_gets_the_same_tokens_alone_and_in_a_mixed_batch(engine, imported):
    imported("w", seed=5)
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20}}, "required": ["answer"]}
    items = [("tiny", CHAT, constrained()), ("w", CHAT, SamplingParams(max_tokens=30)),
             ("w", CHAT, constrained(schema)), ("tiny", CHAT, SamplingParams(max_tokens=12, temperature=1.0, seed=2)),
             ("w", CHAT, constrained(temperature=1.0, seed=11))]
    batch = engine.complete_batch(items)
    for (name, prompt, params), got in zip(items, batch):
        assert got.text == engine.complete(name, prompt, params).text


def test_unconstrained_rows_are_untouched_by_a_constrained_neighbour(engine):
    plain = SamplingParams(max_tokens=16)
    alone = engine.complete("tiny", CHAT, plain).text
    mixed = engine.complete_batch([("tiny", CHAT, constrained()), ("tiny", CHAT, plain)])
    assert mixed[1].text == alone


def test_no_admissible_token_ends_that_row_only(engine):
    resident = engine.resident("tiny")
    ids = CHAT.encode(resident.tokenizer)
    impossible = SamplingParams(max_tokens=10, grammar=Grammar.json_schema({"enum": ["ééé"]}, "format"))
    requests = [GenerationRequest(ids, None, impossible), GenerationRequest(ids, None, SamplingParams(max_tokens=8))]
    ends = {}
    for deltas in generate(resident, requests):
        ends.update({d.index: d for d in deltas if d.finish_reason})
    assert ends[0].finish_reason == "error" and "admits no next token" in ends[0].error
    assert "\n" not in ends[0].error
    assert ends[1].finish_reason in {"stop", "length"}


@pytest.mark.parametrize("schema, named", [
    ({"type": "strang"}, "strang"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"not": {"type": "string"}}, "not"),
    ({"$ref": "#/$defs/missing"}, "missing"),
    ({"type": "string", "pattern": "(("}, "regex"),
    (5, "JSON schema"),
    ("{}", "JSON schema"),
])
def test_bad_schemas_are_refused_naming_the_keyword(schema, named):
    with pytest.raises(InvalidInput, match=named) as caught:
        Grammar.json_schema(schema, "response_format.json_schema.schema")
    assert "response_format.json_schema.schema" in str(caught.value) and "\n" not in str(caught.value)


def test_recursive_refs_are_supported():
    tree = {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"}
    assert Grammar.json_schema(tree, "format").text


def test_listed_properties_close_the_object_unless_the_schema_opens_it(engine):
    closed = {"type": "object", "properties": {"k": {"type": "integer", "maximum": 9}}, "required": ["k"]}
    for seed in range(3):
        out = engine.complete("tiny", CHAT, constrained(closed, temperature=1.5, seed=seed))
        assert list(json.loads(out.text)) == ["k"]
    opened = {**closed, "additionalProperties": {"type": "integer", "minimum": 0}}
    assert tightened(opened) == opened
    data = {"properties": {"x": {}}}    # a value, not a schema: left as it is
    nested = {"type": "array", "items": closed, "default": [data], "enum": [data]}
    assert tightened(nested) == {**nested, "items": {**closed, "additionalProperties": False}}


def test_an_unbounded_integer_ends_within_the_safe_range(engine):
    """A small model writes digits until max_tokens when nothing stops it (the 135M base did in 3
    of 20 answers); an integer the schema leaves unbounded is held to ±(2**53 - 1)."""
    assert tightened({"type": "integer"}) == {"type": "integer", "minimum": -SAFE_INTEGER, "maximum": SAFE_INTEGER}
    assert tightened({"type": "integer", "exclusiveMaximum": 5}) == {"type": "integer", "exclusiveMaximum": 5}
    for seed in range(6):
        out = engine.complete("tiny", CHAT, constrained({"type": "integer"}, temperature=1.5, seed=seed))
        assert out.finish_reason == "stop" and abs(int(out.text)) <= SAFE_INTEGER


def test_an_answer_near_its_token_limit_closes_its_json(engine):
    """Free strings on a random model run on; near max_tokens the row takes only tokens that end
    the JSON (a quote, a bracket, then a comma towards the keys still owed), so it finishes whole."""
    free = {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["s", "n"]}
    for seed in range(8):
        out = engine.complete("tiny", CHAT, constrained(free, temperature=1.5, seed=seed, max_tokens=60))
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), free)


@pytest.mark.parametrize(("text", "rank"), [
    (b'"', 0), (b'"}', 0), (b'abc"', 0), (b'" ]', 0),        # close the string (and brackets), open nothing
    (b"}", 1), (b" ]", 1), (b"}}", 1),                          # close a bracket
    (b",", 2), (b'", "', 2), (b',"', 2), (b"},", 2),             # go on: a comma, even one that closes first
    (b'{"', None), (b':"', None), (b"x", None), (b'\\"', None), (b'\\', None)])
def test_closing_ranks_a_token_that_closes_and_reopens_as_a_comma(text, rank):
    """An array of strings on the real base ran to the limit when `", "` counted as closing."""
    from zenedge.runtime.grammar import closing_class

    assert closing_class(text) == rank
