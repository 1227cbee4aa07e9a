"""What zenedge does with each request field a client may send that the wire models do not honour.

The wire models (wire.py) declare the fields zenedge honours. A client library sends more: the
official SDKs' whole parameter lists, agent frameworks' tool and format options, Ollama's runner
options. A field zenedge drops must never turn into an answer to a different question (free text
where JSON was asked for, no tool call where one was required), so every other field falls in one
of three rows here:

- metadata: it does not change the answer (OpenAI's `user`, `metadata`, cache keys; Ollama's
  memory, thread and GPU settings, which configure Ollama's own runner). Accepted.
- neutral only: a feature zenedge does not have, accepted at the value that asks for nothing
  (`typical_p: 1`, `tools: []`, `top_k: 0`).
- anything else, including a name no API defines: refused with a 400 naming the field.

`null` is the same as absent everywhere (SDKs send it for unset parameters). The tests walk every
parameter of the official `openai` and `ollama` clients' request types through these rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from zenedge.errors import InvalidInput


@dataclass(frozen=True)
class Rule:
    accepts: Callable[[Any], bool]
    neutral: str      # what the error says is accepted ("" for a field refused at every value)
    why: str          # why zenedge cannot honour another value


def metadata(why: str) -> Rule:
    return Rule(lambda value: True, "any value", why)


def only(*values: Any, why: str) -> Rule:
    shown = " or ".join(_shown(v) for v in values)
    # `True == 1` in Python: compare types too, so `logprobs: 1` is not mistaken for `true`.
    return Rule(lambda value: any(type(value) is type(v) and value == v for v in values), shown, why)


def empty(why: str) -> Rule:
    return Rule(lambda value: value in ([], {}, ""), "empty", why)


def refused(why: str) -> Rule:
    return Rule(lambda value: False, "", why)


def _shown(value: Any) -> str:
    return json.dumps(value)


_FUNCTIONS = "the deprecated functions API is not supported: send `tools`"
_RUNNER = "Ollama's runner settings (memory, threads, GPUs, batch, context): zenedge sizes its own"

# POST /v1/chat/completions: every parameter of the openai SDK's CompletionCreateParams.
OPENAI_CHAT: dict[str, Rule] = {
    "user": metadata("an end-user id for the provider's records"),
    "safety_identifier": metadata("an end-user id for the provider's records"),
    "metadata": metadata("tags for the provider's records"),
    "service_tier": metadata("a billing tier: there is one local tier"),
    "prompt_cache_key": metadata("a cache hint: zenedge keeps no prompt cache between requests"),
    "prompt_cache_retention": metadata("a cache hint: zenedge keeps no prompt cache between requests"),
    "prompt_cache_options": metadata("a cache hint: zenedge keeps no prompt cache between requests"),
    "prediction": metadata("a speed hint (predicted output); the answer does not depend on it"),
    "parallel_tool_calls": metadata("permission, not a demand: an answer holds one call or several"),
    "store": only(False, why="stored completions are not kept"),
    "modalities": only(["text"], why="zenedge answers in text"),
    "audio": refused("zenedge answers in text"),
    "logit_bias": empty("logit biases are not applied"),
    "functions": empty(_FUNCTIONS),
    "function_call": only("none", "auto", why=_FUNCTIONS),
    "reasoning_effort": refused("the model does not reason before answering"),
    "verbosity": refused("the answer's length is set by max_tokens, not a verbosity level"),
    "web_search_options": refused("zenedge does not search the web"),
    "moderation": refused("zenedge does not moderate"),
}

# POST /v1/responses: every parameter of the openai SDK's ResponseCreateParams.
_STATELESS = "responses are not stored: send the whole conversation as `input`"
OPENAI_RESPONSES: dict[str, Rule] = {
    **{name: OPENAI_CHAT[name] for name in (
        "user", "safety_identifier", "metadata", "service_tier", "prompt_cache_key", "prompt_cache_retention",
        "prompt_cache_options", "parallel_tool_calls", "moderation")},
    "store": only(False, why=_STATELESS),
    "previous_response_id": refused(_STATELESS),
    "conversation": refused(_STATELESS),
    "context_management": refused(_STATELESS),
    "prompt": refused("stored prompt templates are not kept: send `instructions` and `input`"),
    "background": only(False, why="a response is answered while the request waits (or streams)"),
    "background_options": refused("a response is answered while the request waits (or streams)"),
    "reasoning": refused("the model does not reason before answering"),
    "max_tool_calls": refused("the number of calls in an answer is not capped"),
    "truncation": only("disabled", why="a conversation longer than the context is refused, not truncated"),
    "stream_options": metadata("obfuscation padding against network side channels; loopback only"),
    "access_programs": refused("hosted tool programs are not supported"),
    "image": refused("zenedge answers in text"),
}
OPENAI_RESPONSES_TEXT: dict[str, Rule] = {
    "verbosity": refused("the answer's length is set by max_output_tokens, not a verbosity level"),
}

# POST /v1/completions
OPENAI_COMPLETION: dict[str, Rule] = {
    "user": OPENAI_CHAT["user"],
    "logit_bias": OPENAI_CHAT["logit_bias"],
    "best_of": only(1, why="one candidate is generated per choice"),
    "echo": only(False, why="the prompt is not repeated in the answer"),
    "suffix": only("", why="fill-in-the-middle is not supported"),
}

# POST /v1/embeddings
OPENAI_EMBEDDING: dict[str, Rule] = {"user": OPENAI_CHAT["user"]}

# One message of /v1/chat/completions' `messages`.
OPENAI_MESSAGE: dict[str, Rule] = {
    "name": refused("participant names are not rendered by the chat template"),
    "function_call": refused(_FUNCTIONS),
    "refusal": metadata("an assistant's earlier refusal text; its content carries the turn"),
    "audio": refused("zenedge answers in text"),
}

# `stream_options`
OPENAI_STREAM_OPTIONS: dict[str, Rule] = {
    "include_obfuscation": metadata("padding against length side channels on the network; loopback only"),
}

# /api/chat and /api/generate `options`: every field of the ollama client's Options.
OLLAMA_OPTIONS: dict[str, Rule] = {
    **{name: metadata(_RUNNER) for name in (
        "numa", "num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
        "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread")},
    "num_keep": metadata("tokens kept when Ollama truncates a long prompt; zenedge refuses one instead"),
    "penalize_newline": only(True, why="a newline is penalised like any token"),
    "tfs_z": only(1, 1.0, why="tail-free sampling is not implemented"),
    "typical_p": only(1, 1.0, why="locally typical sampling is not implemented"),
    "mirostat": only(0, why="mirostat sampling is not implemented"),
    "mirostat_tau": metadata("a mirostat setting, which only 0 (off) is accepted for"),
    "mirostat_eta": metadata("a mirostat setting, which only 0 (off) is accepted for"),
}

# /api/chat and /api/generate, beyond what the models declare (they refuse images…).
OLLAMA_CHAT: dict[str, Rule] = {}
OLLAMA_GENERATE: dict[str, Rule] = {
    "width": refused("image generation is not supported"),
    "height": refused("image generation is not supported"),
    "steps": refused("image generation is not supported"),
}

# One message of /api/chat's `messages`.
OLLAMA_MESSAGE: dict[str, Rule] = {
    "thinking": only("", why="thinking is not supported"),
}

def check(fields: Any, declared: set[str], rules: dict[str, Rule], where: str = "") -> None:
    """Refuse the first field that is neither declared (honoured) nor accepted by its rule, with
    one line naming it. `fields` is the raw request object; anything but a dict is left to the
    schema's own error."""
    if not isinstance(fields, dict):
        return
    for name, value in fields.items():
        if name in declared or value is None:
            continue
        field = f"{where}{name}"
        rule = rules.get(name)
        if rule is None:
            raise InvalidInput(f"`{field}` is not a field zenedge knows, so it cannot be honoured",
                               hint="remove it; zenedge refuses what it would otherwise ignore")
        if not rule.accepts(value):
            accepted = f"; only {rule.neutral} is accepted" if rule.neutral else ""
            raise InvalidInput(f"`{field}` is not supported by zenedge: {rule.why}{accepted}",
                               hint="remove it, or send null")
