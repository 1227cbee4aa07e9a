"""OpenAI's Responses API: `POST /v1/responses` (the SDK's `client.responses.create`, `.parse`,
`.stream`).

A response is a chat completion under another wire (api/responses.py): `instructions` and
`input` become the chat messages, `tools` and `tool_choice` the same ToolPlan, `text.format` the
same grammar as `response_format`, and the job runs on the same scheduler. What differs is the
framing: the answer is a list of output items, a message with its `output_text` and one
`function_call` item per call, and a stream is OpenAI's named events (`response.created`, …,
`response.output_text.delta`, …, `response.completed`), each with its `sequence_number`, no
`[DONE]`. An answer cut by `max_output_tokens` is status "incomplete"; one whose grammar
admitted no next token is "failed", with its error.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from zenedge.api import responses as wire
from zenedge.runtime import tools as calling
from zenedge.runtime.engine import Prompt
from zenedge.runtime.grammar import Grammar
from zenedge.runtime.sampling import SamplingParams
from zenedge.server import errors, streaming
from zenedge.server.logprobs import LogprobText
from zenedge.server.openai_routes import DEFAULT_MAX_TOKENS, ToolPlan, cancel_all, submit
from zenedge.server.scheduler import Job
from zenedge.server.state import DaemonState

# A row's finish reason as the response's status, and the event that ends its stream ("cancelled":
# the daemon shut down mid-answer; OpenAI's stream has no event of its own for it).
STATUS = {"stop": "completed", "tool_calls": "completed", "length": "incomplete", "error": "failed",
          "cancelled": "cancelled"}
ENDING_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed",
                "cancelled": "response.incomplete"}


def format_grammar(text: wire.TextConfig | None) -> Grammar | None:
    """The grammar `text.format` asks the output to follow (None for free text)."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Grammar.json_object("text.format")
    return Grammar.json_schema(fmt.schema_, "text.format.schema")


def tool_plan(body: wire.ResponseRequest) -> ToolPlan:
    choice = body.tool_choice
    named = choice.name if isinstance(choice, wire.NamedFunctionChoice) else None
    tools = [tool.as_chat_tool() for tool in body.tools or []]
    return ToolPlan.of(tools, None if named else choice, named)


def _ident(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def function_call(call: calling.Call, status: str = "completed") -> wire.OutputFunctionCall:
    return wire.OutputFunctionCall(id=_ident("fc"), call_id=_ident("call"), name=call.name, status=status,
                                   arguments=json.dumps(call.arguments, ensure_ascii=False))


@dataclass
class Shell:
    """What every response object of one request repeats: its id, the request's settings."""

    body: wire.ResponseRequest
    ident: str = field(default_factory=lambda: _ident("resp"))
    created: int = field(default_factory=lambda: int(time.time()))

    def response(self, status: str, output: list, usage: wire.ResponseUsage | None = None,
                 error: str | None = None) -> wire.Response:
        body = self.body
        return wire.Response(
            id=self.ident, created_at=self.created, status=status, model=body.model, output=output,
            instructions=body.instructions, usage=usage,
            incomplete_details=wire.IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
            error=wire.ResponseError(message=error or "the answer failed") if status == "failed" else None,
            tools=body.tools or [], tool_choice=body.tool_choice or ("auto" if body.tools else "none"),
            temperature=body.temperature, top_p=body.top_p, max_output_tokens=body.max_output_tokens,
            text=body.text.model_dump(exclude_none=True, by_alias=True) if body.text and body.text.format
            else {"format": {"type": "text"}})


def usage(prompt_tokens: int, output_tokens: int) -> wire.ResponseUsage:
    return wire.ResponseUsage(input_tokens=prompt_tokens, output_tokens=output_tokens,
                              total_tokens=prompt_tokens + output_tokens)


def output_items(text: str, calls: list[calling.Call], status: str, logprobs: list | None = None) -> list:
    """The answer as output items: its text as one message (none when a call has no text before
    it; with its tokens' `logprobs` when asked and the answer is text only), then each call."""
    items: list = []
    if text or not calls:
        part = wire.OutputText(text=text, logprobs=None if calls else logprobs)
        items.append(wire.OutputMessage(id=_ident("msg"), status=status, content=[part]))
    return items + [function_call(call) for call in calls]


def router(state: DaemonState) -> APIRouter:
    api = APIRouter(prefix="/v1", tags=["openai"])

    @api.post("/responses", response_model=wire.Response, response_model_exclude_none=True,
              responses={200: {"description": "a Response; with `stream: true`, server-sent events named by their "
                                              "`type` (response.created … response.completed)"}})
    async def create(body: wire.ResponseRequest, request: Request):
        plan = tool_plan(body)
        grammar = await run_in_threadpool(lambda: plan.grammar(format_grammar(body.text)))
        params = SamplingParams(grammar=grammar, max_tokens=body.max_output_tokens or DEFAULT_MAX_TOKENS,
                                logprobs=body.logprobs(),
                                temperature=1.0 if body.temperature is None else body.temperature,
                                top_p=1.0 if body.top_p is None else body.top_p)
        prompt = Prompt(messages=wire.chat_messages(body.instructions, body.input), tools=plan.tools)
        jobs, prompt_tokens = await submit(state, request, body.model, prompt, params)
        tokenizer = state.engine.resident(jobs[0].route.base).tokenizer
        watcher = calling.CallStream(plan.tools, tokenizer) if plan.mode != "none" else None
        shell = Shell(body)
        logprobs = LogprobText(tokenizer) if params.logprobs is not None else None
        if body.stream:
            events = _events(jobs[0], shell, prompt_tokens, watcher, logprobs)
            return streaming.JobStreamingResponse(events, on_close=cancel_all(jobs), media_type="text/event-stream")
        (outcome,) = await streaming.collect(request, jobs, prompt_tokens)
        text, calls, reason = outcome.text, [], outcome.finish_reason
        if watcher is not None:
            text, calls = await run_in_threadpool(calling.parse, outcome.text, plan.tools, tokenizer)
            reason = "tool_calls" if calls else reason
        status = STATUS[reason]
        entries = None if logprobs is None else await run_in_threadpool(lambda: logprobs.chat(outcome.logprobs).content)
        return shell.response(status, output_items(text or "", calls, status, entries),
                              usage(prompt_tokens, outcome.completion_tokens), outcome.error)

    return api


class _Framing:
    """The named events of one streamed response, numbered in order."""

    def __init__(self) -> None:
        self.numbers = itertools.count()

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": next(self.numbers)}
        for name, value in fields.items():
            dumped = isinstance(value, BaseModel)
            payload[name] = value.model_dump(exclude_none=True, by_alias=True) if dumped else value
        return streaming.sse(payload, kind)


async def _events(job: Job, shell: Shell, prompt_tokens: int, watcher: calling.CallStream | None,
                  logprobs: LogprobText | None = None) -> AsyncIterator[bytes]:
    """The response's events as its text comes: a message item opened on the first text (text that
    may be a call waits, as on chat), closed at the end; then each call as a function_call item;
    then the whole response. With `logprobs`, each text delta carries its tokens'."""
    out = _Framing()
    yield out.event("response.created", response=shell.response("in_progress", []))
    yield out.event("response.in_progress", response=shell.response("in_progress", []))
    items: list = []
    message: wire.OutputMessage | None = None
    tokens, owed = 0, []   # owed: tokens whose text has not gone out yet

    def open_message() -> list[bytes]:
        nonlocal message
        message = wire.OutputMessage(id=_ident("msg"), status="in_progress", content=[])
        items.append(message)
        opened = [out.event("response.output_item.added", output_index=len(items) - 1, item=message),
                  out.event("response.content_part.added", item_id=message.id, output_index=len(items) - 1,
                            content_index=0, part=wire.OutputText(text=""))]
        message.content.append(wire.OutputText(text="", logprobs=[] if logprobs is not None else None))
        return opened

    def say(piece: str) -> list[bytes]:
        nonlocal owed
        sent = open_message() if message is None else []
        part = message.content[0]
        entries = logprobs.chat(owed).content if logprobs is not None and owed else []
        part.text, owed = part.text + piece, []
        if part.logprobs is not None:
            part.logprobs += entries
        sent.append(out.event("response.output_text.delta", item_id=message.id, output_index=items.index(message),
                              content_index=0, delta=piece, logprobs=[e.model_dump() for e in entries]))
        return sent

    try:
        async for delta in streaming.deltas(job):
            tokens += delta.token_id is not None
            owed += [delta.logprob] if delta.logprob is not None else []
            piece = watcher.feed(delta.text) if watcher is not None else delta.text
            for event in say(piece) if piece else ():
                yield event
            if not delta.finish_reason:
                continue
            reason, calls = delta.finish_reason, []
            if watcher is not None:
                rest, calls = await run_in_threadpool(watcher.finish)
                for event in say(rest) if rest else ():
                    yield event
                reason = "tool_calls" if calls else reason
            status = STATUS[reason]
            if message is None and not calls:   # an empty answer is still a message
                for event in open_message():
                    yield event
            if message is not None:
                index, part = items.index(message), message.content[0]
                message.status = status
                yield out.event("response.output_text.done", item_id=message.id, output_index=index, content_index=0,
                                text=part.text, logprobs=[e.model_dump() for e in part.logprobs or []])
                yield out.event("response.content_part.done", item_id=message.id, output_index=index,
                                content_index=0, part=part)
                yield out.event("response.output_item.done", output_index=index, item=message)
            for call in calls:
                item = function_call(call, "in_progress")
                items.append(item)
                index, arguments = len(items) - 1, item.arguments
                yield out.event("response.output_item.added", output_index=index,
                                item=item.model_copy(update={"arguments": ""}))
                yield out.event("response.function_call_arguments.delta", item_id=item.id, output_index=index,
                                delta=arguments)
                yield out.event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                                name=item.name, arguments=arguments)
                item.status = "completed"
                yield out.event("response.output_item.done", output_index=index, item=item)
            yield out.event(ENDING_EVENT[status],
                            response=shell.response(status, items, usage(prompt_tokens, tokens), delta.error))
            return
    except errors.ClientGone:
        return
    except Exception as exc:
        yield streaming.sse(errors.stream_payload(exc), "error")
