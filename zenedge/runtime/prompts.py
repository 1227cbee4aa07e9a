"""Prompts as token ids: chat messages through the base's own chat template, or raw text.

`chat_ids` is the one place a chat template is rendered: generation, the eval sets' examples and
the gate's proxy prompts all read their prompts through it, so they see the same tokens.

A base whose tokenizer has no chat template (a GGUF that ships none, a base model) gets the plain
prompt of `plain_chat`: the system text, then a `User: …` / `Assistant: …` / `Tool: …` line per
turn, ending with `Assistant:`; the answer stops before a `User:` line of its own (PLAIN_STOP). The
daemon and the CLI say so once per tokenizer (a warning).
"""

from __future__ import annotations

import logging
import weakref
from typing import Sequence

from zenedge.errors import InvalidInput

log = logging.getLogger("zenedge.runtime")
PLAIN_LABELS = {"user": "User", "assistant": "Assistant", "tool": "Tool"}
PLAIN_STOP = "\nUser:"   # where a model given the plain prompt starts writing the user's next turn
_WARNED: weakref.WeakSet = weakref.WeakSet()   # tokenizers whose missing template was reported


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def plain_chat(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """The fallback prompt for a base without a chat template."""
    parts = []
    for message in messages:
        label = PLAIN_LABELS.get(message["role"])
        parts.append(f"{message['content']}\n\n" if label is None else f"{label}: {message['content']}\n")
    return "".join(parts) + ("Assistant:" if add_generation_prompt else "")


def chat_ids(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True,
             tools: Sequence[dict] | None = None) -> list[int]:
    """Messages in OpenAI form → token ids through the tokenizer's chat template, ending with the
    assistant header when `add_generation_prompt` (the model answers next). `tools`: passed to
    templates that render them (runtime/tools.py decides). Without a template: `plain_chat`."""
    if not has_chat_template(tokenizer):
        if tokenizer not in _WARNED:
            _WARNED.add(tokenizer)
            log.warning("this base's tokenizer has no chat template: chats use zenedge's plain prompt "
                        "(User: … / Assistant:)")
        return list(tokenizer(plain_chat(messages, add_generation_prompt))["input_ids"])
    extra = {"tools": list(tools)} if tools else {}
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt, tokenize=True,
                                        return_dict=False, **extra)
    # Some tokenizer versions still wrap the ids in a BatchEncoding despite return_dict=False.
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def tool_style(tokenizer) -> str:
    """How this base writes a tool call, read from its chat template (runtime/tools.py): "llama3"
    (a bare JSON object), "hermes" (`<tool_call>` blocks: Qwen, Hermes, other templates that
    render tools) or "fallback" (a template with no tool section)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):                 # named templates ("default", "tool_use", …)
        template = " ".join(str(t) for t in template.values())
    if "<|python_tag|>" in template or ("tools" in template and "<|eot_id|>" in template):
        return "llama3"
    return "hermes" if "tools" in template else "fallback"


def encode_chat(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None = None) -> list[int]:
    """A request's chat messages → token ids, each message checked first. `tools`: what the
    template renders (runtime/tools.messages_for_template prepares both)."""
    check_messages(messages)
    return chat_ids(tokenizer, messages, tools=tools)


def check_messages(messages: Sequence[dict]) -> None:
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in {"system", "user", "assistant", "tool"} \
                or not isinstance(message.get("content"), str):
            raise InvalidInput("each message needs a role (system, user, assistant, tool) and string content")


def encode_text(tokenizer, prompt: str) -> list[int]:
    """A raw completion prompt (no chat template)."""
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
