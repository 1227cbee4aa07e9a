"""No request field is ignored silently (api/fields.py): every parameter of the official `openai`
and `ollama` clients' request types is honoured or has a rule, a value the rule cannot honour is
a 400 naming the field, and the daemon answers so on both APIs, Ollama's routes in Ollama's shape."""

from __future__ import annotations

import re
import typing

import httpx
import ollama
import openai
import pytest
from ollama import _types as ollama_types
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import chat_completion_message_param, chat_completion_stream_options_param
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import response_create_params, response_text_config_param
from pydantic import ValidationError

from zenedge.api import fields, responses, wire
from zenedge.errors import InvalidInput

CHAT = {"model": "p0", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


def typed_dict_keys(annotation) -> set[str]:
    """The keys of an SDK TypedDict, or of every TypedDict in a union of them."""
    members = typing.get_args(annotation) or (annotation,)
    return {key for member in members for key in typing.get_type_hints(member)}


def openai_message_keys() -> set[str]:
    return typed_dict_keys(chat_completion_message_param.ChatCompletionMessageParam)


def ollama_keys(*names: str) -> set[str]:
    return {key for name in names for key in getattr(ollama_types, name).model_fields}


# (the model zenedge validates with, its rules, every key the SDK can send there, a valid body, the
# path to the object the field sits in)
SURFACES = {
    "openai chat": (wire.ChatCompletionRequest, fields.OPENAI_CHAT,
                    typed_dict_keys(chat_create_params.CompletionCreateParamsBase) | {"stream"}, CHAT, ()),
    "openai completion": (wire.CompletionRequest, fields.OPENAI_COMPLETION,
                          typed_dict_keys(completion_create_params.CompletionCreateParamsBase) | {"stream"},
                          {"model": "p0", "prompt": "hi"}, ()),
    "openai embedding": (wire.EmbeddingRequest, fields.OPENAI_EMBEDDING,
                         typed_dict_keys(embedding_create_params.EmbeddingCreateParams),
                         {"model": "p0", "input": "hi"}, ()),
    "openai message": (wire.ChatMessage, fields.OPENAI_MESSAGE, openai_message_keys(),
                       {"role": "assistant", "content": "hi"}, ("messages", 0)),
    "openai stream_options": (wire.StreamOptions, fields.OPENAI_STREAM_OPTIONS,
                              typed_dict_keys(chat_completion_stream_options_param.ChatCompletionStreamOptionsParam),
                              {}, ("stream_options",)),
    "openai responses": (responses.ResponseRequest, fields.OPENAI_RESPONSES,
                         typed_dict_keys(response_create_params.ResponseCreateParamsBase) | {"stream"},
                         {"model": "p0", "input": "hi"}, ()),
    "openai responses text": (responses.TextConfig, fields.OPENAI_RESPONSES_TEXT,
                              typed_dict_keys(response_text_config_param.ResponseTextConfigParam), {}, ("text",)),
    "ollama chat": (wire.OllamaChatRequest, fields.OLLAMA_CHAT, ollama_keys("ChatRequest"),
                    {"model": "p0", "messages": []}, ()),
    "ollama generate": (wire.OllamaGenerateRequest, fields.OLLAMA_GENERATE, ollama_keys("GenerateRequest"),
                        {"model": "p0"}, ()),
    "ollama options": (wire.OllamaOptions, fields.OLLAMA_OPTIONS, ollama_keys("Options"), {}, ("options",)),
    "ollama message": (wire.OllamaMessage, fields.OLLAMA_MESSAGE, ollama_keys("Message"), {"role": "user"},
                       ("messages", 0)),
    "ollama embed": (wire.OllamaEmbedRequest, {}, ollama_keys("EmbedRequest"), {"model": "p0", "input": "hi"}, ()),
    "ollama embeddings": (wire.OllamaEmbeddingsRequest, {}, ollama_keys("EmbeddingsRequest"), {"model": "p0"}, ()),
    "ollama show": (wire.OllamaShowRequest, {}, ollama_keys("ShowRequest"), {"model": "p0"}, ()),
    "ollama delete": (wire.OllamaDeleteRequest, {}, ollama_keys("DeleteRequest"), {"model": "p0"}, ()),
}
NOT_NEUTRAL = {"asks": "for something"}   # no rule's neutral value: a metadata rule alone accepts it


@pytest.mark.parametrize("surface", SURFACES)
def test_every_field_the_sdks_send_is_honoured_or_has_a_rule(surface):
    model, rules, sent, _, _ = SURFACES[surface]
    declared = set(model.model_fields)
    assert sent - declared - set(rules) == set(), "fields with neither a model field nor a rule"
    assert set(rules) & declared == set(), "a rule for a field the model honours itself"
    assert set(rules) <= sent, "a rule for a field no client sends (stale)"


@pytest.mark.parametrize(("surface", "name"), [(s, n) for s, v in SURFACES.items() for n in v[1]])
def test_a_value_a_rule_cannot_honour_is_refused_naming_the_field(surface, name):
    model, rules, _, body, _ = SURFACES[surface]
    rule = rules[name]
    if rule.neutral == "any value":
        assert name not in model.model_validate({**body, name: NOT_NEUTRAL}).model_dump()  # metadata: dropped
        return
    with pytest.raises(InvalidInput, match=re.escape(f"`{model.where}{name}` is not supported by zenedge: {rule.why}")):
        model.model_validate({**body, name: NOT_NEUTRAL})
    model.model_validate({**body, name: None})   # null is absent


# What SDKs and frameworks send by default or as "off": accepted in one request each.
NEUTRAL_CHAT = {"user": "u1", "metadata": {"k": "v"}, "store": False, "modalities": ["text"], "logit_bias": {},
                "logprobs": False, "top_logprobs": 0, "tools": [], "tool_choice": "auto", "functions": [],
                "response_format": {"type": "text"}, "parallel_tool_calls": True, "service_tier": "auto",
                "frequency_penalty": 0.5, "presence_penalty": -0.5, "n": 1,
                "stream_options": {"include_usage": True, "include_obfuscation": False}}
NEUTRAL_OPTIONS = {"num_ctx": 4096, "num_thread": 8, "num_gpu": 99, "use_mmap": True, "top_k": 40, "min_p": 0.05,
                   "repeat_penalty": 1.1, "repeat_last_n": 64, "typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0,
                   "mirostat_tau": 5.0, "mirostat_eta": 0.1, "penalize_newline": True, "num_keep": 4}


def test_what_clients_send_as_off_is_accepted():
    wire.ChatCompletionRequest.model_validate({**CHAT, **NEUTRAL_CHAT})
    responses.ResponseRequest.model_validate({"model": "p0", "input": "hi", "store": False, "include": [],
                                              "top_logprobs": 0, "truncation": "disabled", "background": False,
                                              "parallel_tool_calls": True, "user": "u1", "tools": [],
                                              "text": {"format": {"type": "text"}}})
    wire.OllamaChatRequest.model_validate({"model": "p0", "messages": [], "options": NEUTRAL_OPTIONS,
                                           "logprobs": False, "top_logprobs": 0})
    wire.OllamaEmbedRequest.model_validate({"model": "p0", "input": "x", "options": {"top_k": 40, "num_ctx": 8}})


@pytest.mark.parametrize(("model", "body", "named"), [
    (wire.ChatCompletionRequest, {**CHAT, "tempreature": 0.5}, "tempreature"),
    (wire.ChatCompletionRequest, {**CHAT, "messages": [{"role": "user", "content": "x", "cache_control": {}}]},
     "messages[].cache_control"),
    (wire.OllamaChatRequest, {"model": "p0", "options": {"num_predikt": 3}}, "options.num_predikt"),
    (wire.OllamaGenerateRequest, {"model": "p0", "max_tokens": 3}, "max_tokens"),
])
def test_a_name_no_api_defines_is_refused(model, body, named):
    with pytest.raises(InvalidInput, match=re.escape(f"`{named}` is not a field zenedge knows")):
        model.model_validate(body)


def test_developer_and_null_assistant_content():
    request = wire.ChatCompletionRequest.model_validate({**CHAT, "messages": [
        {"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None}, {"role": "user", "content": "again"}]})
    assert [m.template_role for m in request.messages] == ["system", "user", "assistant", "user"]
    assert request.messages[2].text() == ""
    with pytest.raises(ValidationError, match="a user message needs `content`"):
        wire.ChatCompletionRequest.model_validate({**CHAT, "messages": [{"role": "user", "content": None}]})


# -- through the daemon, with the official clients ---------------------------------------------------
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("extra", "named"), [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}),
     "response_format.json_schema.schema"),
    (dict(functions=[{"name": "f", "parameters": {"type": "object"}}]), "functions"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(top_logprobs=2), "top_logprobs"),
    (dict(reasoning_effort="low"), "reasoning_effort"),
    (dict(extra_body={"top_k": 5}), "top_k"),
])
def test_openai_requests_zenedge_cannot_honour_are_400s_naming_the_field(openai_client, extra, named):
    with pytest.raises(openai.BadRequestError, match=f"`{named}`") as refused:
        openai_client.chat.completions.create(model="p0", messages=MESSAGES, max_tokens=4, **extra)
    assert refused.value.body["code"] == "invalid_input"


def test_openai_neutral_fields_developer_role_and_models_retrieve(openai_client):
    asked = dict(model="p0", max_tokens=6, temperature=0)
    plain = openai_client.chat.completions.create(messages=[{"role": "system", "content": "be brief"}, *MESSAGES],
                                                  **asked).choices[0].message.content
    developer = openai_client.chat.completions.create(
        messages=[{"role": "developer", "content": "be brief"}, *MESSAGES], user="u1", store=False,
        metadata={"run": "1"}, tools=[], response_format={"type": "text"}, **asked).choices[0].message.content
    assert developer == plain
    history = [*MESSAGES, {"role": "assistant", "content": None}, {"role": "user", "content": "and?"}]
    assert openai_client.chat.completions.create(messages=history, **asked).choices[0].finish_reason
    card = openai_client.models.retrieve("p0")
    assert card.id == "p0" and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("ghost")


def test_openai_penalties_are_honoured(openai_client):
    asked = dict(model="p0", messages=MESSAGES, max_tokens=16, temperature=0)
    plain = openai_client.chat.completions.create(**asked).choices[0].message.content
    penalised = openai_client.chat.completions.create(**asked, frequency_penalty=2.0).choices[0].message.content
    assert penalised != plain


@pytest.mark.parametrize(("call", "named"), [
    (lambda c: c.chat(model="p0", messages=MESSAGES, options={"mirostat": 2}), "options.mirostat"),
    (lambda c: c.chat(model="p0", messages=MESSAGES, top_logprobs=2), "top_logprobs"),   # without logprobs
    (lambda c: c.generate(model="p0", prompt="hi", options={"typical_p": 0.5}), "options.typical_p"),
    (lambda c: c.chat(model="p0", messages=[{"role": "assistant", "content": "", "thinking": "hmm"}]),
     "messages[].thinking"),
])
def test_ollama_requests_zenedge_cannot_honour_are_400s_in_ollamas_shape(ollama_client, call, named):
    with pytest.raises(ollama.ResponseError, match=re.escape(f"`{named}`")) as refused:
        call(ollama_client)
    assert refused.value.status_code == 400 and isinstance(refused.value.error, str)


def test_ollama_sampling_options_are_honoured(ollama_client):
    asked = dict(model="p0", messages=MESSAGES)
    greedy = dict(temperature=0, num_predict=16, num_ctx=2048, num_thread=4)
    plain = ollama_client.chat(**asked, options=greedy).message.content
    assert ollama_client.chat(**asked, options={**greedy, "top_k": 40}).message.content == plain  # greedy: no-op
    assert ollama_client.chat(**asked, options={**greedy, "repeat_penalty": 3.0}).message.content != plain
    hot = dict(temperature=1.5, seed=4, num_predict=16)
    one = ollama_client.chat(**asked, options={**hot, "top_k": 1}).message.content
    assert one == plain   # top-k 1 is greedy at any temperature


def test_an_unknown_field_on_an_ollama_route_is_ollamas_400(daemon):
    answer = httpx.post(f"{daemon.tcp_url}/api/generate", headers={"Authorization": f"Bearer {daemon.token}"},
                        json={"model": "p0", "prompt": "hi", "stream": False, "max_tokens": 3})
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("`max_tokens` is not a field zenedge knows, so it cannot be honoured")
