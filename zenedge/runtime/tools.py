"""Tool calling: the tools a request offers rendered into the prompt, the model's calls held to
their schemas when a call is required, and calls read back out of the answer.

Three ways a base writes a call, chosen from its chat template (`style`):
- "hermes" (Qwen 2.5/3, Hermes, and any template that renders `tools`, unless it is Llama 3's):
  `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`, one block per call;
- "llama3": the call as one bare JSON object, `{"name": …, "parameters": {…}}`;
- "fallback", for a template with no tool section (SmolLM2's): the tools and the Hermes format
  are described in a system message (FALLBACK_PROMPT), and earlier calls and results are written
  into the turns as Hermes does (`<tool_call>` in the assistant's turn, `<tool_response>` in a
  user turn). Calls are read as Hermes blocks.

With tool_choice "required" or a named function, the answer is decoded under a grammar of one
call in the base's style whose arguments validate against the function's schema. With "auto",
the answer is free, and a call is returned only when it parses and its arguments validate; an
answer that looks like a call but is not one is returned as text, never half-parsed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from zenedge.errors import InvalidInput
from zenedge.runtime.grammar import JSON_OPTIONS, Grammar, tightened
from zenedge.runtime.prompts import tool_style as style

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
FALLBACK_PROMPT = (
    "You can call tools. Each tool is described by its name, what it does, and a JSON schema of its "
    "arguments:\n{tools}\n\nTo call a tool, answer with only\n<tool_call>\n"
    '{{"name": "<the tool\'s name>", "arguments": {{<its arguments as JSON>}}}}\n</tool_call>\n'
    "A tool's result comes back in a <tool_response> block. Answer without a call when no tool is needed.")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict


def messages_for_template(tokenizer, messages: Sequence[dict], tools: Sequence[dict]) -> tuple[list[dict], list | None]:
    """Messages (OpenAI's shape, tool calls' arguments as JSON strings or objects) and tools as the
    base's template takes them: `tools` passed on where it renders them, else written in."""
    if style(tokenizer) != "fallback":
        return [_for_template(m) for m in messages], (list(tools) or None)
    written = [_written_in(m) for m in messages]
    if tools:
        described = "\n".join(json.dumps(_described(tool), ensure_ascii=False) for tool in tools)
        prompt = FALLBACK_PROMPT.format(tools=described)
        if written and written[0]["role"] == "system":
            written[0] = {"role": "system", "content": f"{written[0]['content']}\n\n{prompt}"}
        else:
            written.insert(0, {"role": "system", "content": prompt})
    return written, None


def _for_template(message: dict) -> dict:
    """HF templates take a call's arguments as an object (they serialise it themselves)."""
    if not message.get("tool_calls"):
        return message
    calls = [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
             for c in (_call_of(call) for call in message["tool_calls"])]
    return {**message, "content": message.get("content") or "", "tool_calls": calls}


def _written_in(message: dict) -> dict:
    role, content = message["role"], message.get("content") or ""
    if role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    if role == "assistant" and message.get("tool_calls"):
        blocks = [_hermes(_call_of(call)) for call in message["tool_calls"]]
        return {"role": "assistant", "content": "\n".join(([content] if content else []) + blocks)}
    return {"role": role, "content": content}


def _call_of(call: dict) -> dict:
    """{"name", "arguments" (an object)} from OpenAI's or Ollama's shape of an earlier call."""
    function = call.get("function", call)
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise InvalidInput(f"a tool call's arguments are not JSON: {arguments[:60]!r}") from None
    return {"name": function["name"], "arguments": arguments}


def _hermes(call: dict) -> str:
    return f"{HERMES_OPEN}\n{json.dumps(call, ensure_ascii=False)}\n{HERMES_CLOSE}"


def _described(tool: dict) -> dict:
    function = tool["function"]
    return {"name": function["name"], "description": function.get("description") or "",
            "parameters": function.get("parameters") or {"type": "object"}}


def call_grammar(tools: Sequence[dict], only: str | None = None) -> Grammar:
    """One call of one of `tools` (or of `only`), its arguments valid against that function's
    schema, written in each style: the row takes its base's when it starts."""
    functions = [_described(t) for t in tools if only is None or t["function"]["name"] == only]
    if not functions:
        raise InvalidInput(f"`tool_choice` names {only!r}, which is not among `tools`")
    texts = {}
    for name in ("hermes", "llama3", "fallback"):
        key = "parameters" if name == "llama3" else "arguments"
        options = [{"type": "object", "properties": {"name": {"const": f["name"]}, key: f["parameters"]},
                    "required": ["name", key], "additionalProperties": False} for f in functions]
        call = json.dumps({"anyOf": tightened(options), "x-guidance": JSON_OPTIONS})
        if name == "llama3":
            lark = f"start: %json {call}"
        else:
            lark = f'start: "{HERMES_OPEN}\\n" call "\\n{HERMES_CLOSE}"\ncall: %json {call}'
        texts[name] = Grammar.lark(lark, "`tools`").text
    return Grammar(texts["hermes"], "the tool call", styles=tuple(texts.items()))


def arguments_grammar(tool: dict) -> Grammar:
    return Grammar.json_schema(_described(tool)["parameters"], f"tools[{tool['function']['name']}].parameters")


_HERMES_BLOCK = re.compile(re.escape(HERMES_OPEN) + r"\s*(.*?)\s*" + re.escape(HERMES_CLOSE), re.DOTALL)


def parse(text: str, tools: Sequence[dict], tokenizer) -> tuple[str, list[Call]]:
    """The answer's text and its tool calls. Either every call in it parses, names an offered
    tool and has valid arguments, or the whole answer is text with no calls."""
    by_name = {t["function"]["name"]: t for t in tools}
    stripped = text.strip()
    if HERMES_OPEN in text:
        found = [_decoded(body) for body in _HERMES_BLOCK.findall(text)]
        content = _HERMES_BLOCK.sub("", text).strip()
        if HERMES_OPEN in content:              # an unclosed block: not a call
            return text, []
    elif stripped.startswith("{"):
        found, content = [_decoded(stripped)], ""
    else:
        return text, []
    calls = []
    for body in found:
        name = body.get("name") if isinstance(body, dict) else None
        arguments = body.get("arguments", body.get("parameters")) if isinstance(body, dict) else None
        if name not in by_name or not isinstance(arguments, dict):
            return text, []
        if not arguments_grammar(by_name[name]).accepts(json.dumps(arguments, ensure_ascii=False), tokenizer):
            return text, []
        calls.append(Call(name, arguments))
    return (content, calls) if calls else (text, [])


def _decoded(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


class CallStream:
    """Streams an answer's text while holding back what may be a tool call, so that a streamed
    answer reads the same as `parse` of the whole: text before a `<tool_call>` (or an answer that
    opens with `{`, Llama 3's call) goes out at once; the rest waits for the end, where it becomes
    calls if every one parses and validates, or text otherwise."""

    def __init__(self, tools: Sequence[dict], tokenizer):
        self.tools, self.tokenizer = tools, tokenizer
        self.sent, self.held = "", ""
        self.holding = False          # a call has begun: everything waits for `finish`

    def feed(self, text: str) -> str:
        """The part of `text` that can be sent now."""
        self.held += text
        if not self.holding:
            if not (self.sent + self.held).strip():
                return ""            # leading whitespace: wait to see whether a JSON call follows
            if not self.sent.strip() and self.held.lstrip().startswith("{"):
                self.holding = True
            elif (at := self.held.find(HERMES_OPEN)) >= 0:
                self.holding = True
                return self._send(at)
            else:
                return self._send(len(self.held) - _partial_suffix(self.held, HERMES_OPEN))
        return ""

    def _send(self, upto: int) -> str:
        out, self.held = self.held[:upto], self.held[upto:]
        self.sent += out
        return out

    def finish(self) -> tuple[str, list[Call]]:
        """What is still to send as text, and the calls (with them, no more text is sent)."""
        _, calls = parse(self.sent + self.held, self.tools, self.tokenizer)
        if calls:
            return "", calls
        rest, self.held = self.held, ""
        return rest, []


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (it may be completed next)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
