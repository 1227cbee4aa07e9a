"""OpenAI-compatible endpoints: /v1/models (and /v1/models/{id}), /v1/chat/completions,
/v1/completions, /v1/embeddings (/v1/responses, the same answers under another wire, is
responses_routes.py).

`model` is a profile in the pool or a base name. Sampling follows OpenAI's defaults (temperature 1,
top_p 1, no penalties); `max_completion_tokens` wins over `max_tokens`. No field is ignored
silently: the SDK's parameters zenedge does not honour are accepted only where they cannot change
the answer (`user`), else refused with a 400 naming the field (api/fields.py). `n` choices are
jobs submitted together (rows of one batch; with a seed, choice i uses seed + i), and a stream
interleaves their chunks by `index`. `logprobs` are the model's own (runtime/sampling.TokenLogprob),
each token named by its text and bytes. `tools` are rendered into the prompt (runtime/tools.py); with
`tool_choice` "required" or a named function the answer is one call decoded under its schema, and
with "auto" a call is returned when the answer parses as one, else the answer is text.
`developer` messages render as `system`. Streams are server-sent events ending
with `data: [DONE]`; with `stream_options.include_usage` a last chunk without choices carries the
usage, as OpenAI sends it. Embeddings are unit vectors from the resident base with the profile's
variant applied (runtime/embed.py), as floats or, as OpenAI's SDKs ask by default, base64.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, replace
from typing import AsyncIterator

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from zenedge.api import wire
from zenedge.errors import AdapterNotFound, InvalidInput
from zenedge.runtime import tools as calling
from zenedge.runtime.embed import Embedder
from zenedge.runtime.engine import Prompt
from zenedge.runtime.generate import SamplingParams
from zenedge.runtime.grammar import Grammar
from zenedge.runtime.sampling import TokenLogprob
from zenedge.server import errors, streaming
from zenedge.server.logprobs import LogprobText, logprobs_asked
from zenedge.server.scheduler import Job
from zenedge.server.state import DaemonState

DEFAULT_MAX_TOKENS = 256


def stream_doc(chunk: str) -> dict:
    """OpenAPI: with `stream: true`, a 200 is server-sent events whose `data:` lines are `chunk`s."""
    return {200: {"description": f"a JSON body; with `stream: true`, server-sent events whose data lines are "
                                 f"{chunk} objects (or an ErrorBody), ending with `data: [DONE]`",
                  "content": {"text/event-stream": {"schema": {"$ref": f"#/components/schemas/{chunk}"}}}}}


def sampling(body: wire.SamplingFields, max_tokens: int | None, grammar: Grammar | None = None,
             logprobs: int | None = None) -> SamplingParams:
    stop = body.stop if body.stop is not None else ()
    return SamplingParams(
        grammar=grammar,
        logprobs=logprobs,
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
    )


def response_grammar(response_format: wire.ResponseFormat | None) -> Grammar | None:
    """The grammar `response_format` asks the output to follow (None for free text)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Grammar.json_object("response_format")
    schema = response_format.json_schema.schema_
    return Grammar.json_schema({} if schema is None else schema, "response_format.json_schema.schema")


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request's `tools` and `tool_choice` ask: `mode` "none" (no call read back),
    "auto" (a call read back when the answer is one) or "required" (the answer is one call, of
    `only` when a function is named)."""

    tools: list[dict]
    mode: str
    only: str | None = None

    @classmethod
    def of(cls, tools: list[wire.Tool] | None, choice: str | None, named: str | None = None) -> "ToolPlan":
        """`choice`: "none", "auto" (the default with tools) or "required"; `named`: the function
        a named tool_choice requires."""
        dumped = [tool.model_dump(exclude_none=True) for tool in tools or []]
        if named is not None:
            return cls(dumped, "required", named)
        choice = choice or ("auto" if dumped else "none")
        if choice == "required" and not dumped:
            raise InvalidInput('`tool_choice` "required" needs `tools`')
        return cls(dumped, choice if dumped else "none")

    def grammar(self, answer: Grammar | None) -> Grammar | None:
        """The grammar the answer decodes under, given `answer`, the one its output format asks
        for (already compiled, so a bad schema there is a 400 too); every tool's schema is checked
        (a 400 now). A required call wins over the format: the answer is then a call and has no
        text for the format to shape (as OpenAI answers; instructor's Responses mode sends both,
        the format being the call's own schema)."""
        if self.mode == "none":
            return answer
        call = calling.call_grammar(self.tools, self.only)
        return answer if self.mode == "auto" else call


def wire_calls(calls: list[calling.Call]) -> list[wire.ToolCall]:
    return [wire.ToolCall(id=f"call_{secrets.token_hex(12)}",
                          function=wire.FunctionCall(name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False)))
            for c in calls]


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice `index` of a request with `n` > 1: with a seed, it samples with seed + index (so that
    seeded choices differ and each reproduces); without one, each draws its own."""
    if params.seed is None or index == 0:
        return params
    return replace(params, seed=(params.seed + index) % 2**64)


def usage(prompt_tokens: int, completion_tokens: int) -> wire.Usage:
    return wire.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                      total_tokens=prompt_tokens + completion_tokens)


async def submit(state: DaemonState, request: Request, model: str, prompt: Prompt, params: SamplingParams,
                 n: int = 1) -> tuple[list[Job], int]:
    """A job per choice, submitted together (they decode as rows of one batch), once all started;
    and the prompt's tokens."""
    route = await run_in_threadpool(state.route, model)
    jobs: list[Job] = []
    try:
        for index in range(n):
            jobs.append(state.scheduler.submit(route, prompt, choice_params(params, index)))
        prompt_tokens = [await streaming.started(request, job) for job in jobs][0]
    except BaseException:
        for job in jobs:
            job.cancel()
        raise
    return jobs, prompt_tokens


def cancel_all(jobs: list[Job]):
    return lambda: [job.cancel() for job in jobs]


def router(state: DaemonState, embedder: Embedder) -> APIRouter:
    api = APIRouter(prefix="/v1", tags=["openai"])

    @api.get("/models", response_model=wire.ModelList)
    async def models() -> wire.ModelList:
        return await run_in_threadpool(_models, state)

    @api.get("/models/{model:path}", response_model=wire.ModelCard)
    async def model(model: str) -> wire.ModelCard:
        return await run_in_threadpool(_model, state, model)

    @api.post("/chat/completions", response_model=wire.ChatCompletion, response_model_exclude_none=True,
              responses=stream_doc("ChatCompletionChunk"))
    async def chat_completions(body: wire.ChatCompletionRequest, request: Request):
        choice = body.tool_choice
        named = choice.function.name if isinstance(choice, wire.NamedToolChoice) else None
        plan = ToolPlan.of(body.tools, None if named else choice, named)
        grammar = await run_in_threadpool(   # a bad schema: a 400 now
            lambda: plan.grammar(response_grammar(body.response_format)))
        params = sampling(body, body.max_completion_tokens or body.max_tokens, grammar,
                          logprobs_asked(body.logprobs, body.top_logprobs))
        prompt = Prompt(messages=[m.for_template() for m in body.messages], tools=plan.tools)
        ident, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
        jobs, prompt_tokens = await submit(state, request, body.model, prompt, params, body.n or 1)
        tokenizer = state.engine.resident(jobs[0].route.base).tokenizer
        calls_wanted, logprobs_wanted = plan.mode != "none", params.logprobs is not None

        def framing(index: int) -> ChatFraming:
            return ChatFraming(ident, created, body.model, index, LogprobText(tokenizer) if logprobs_wanted else None)

        if body.stream:
            counts = [0] * len(jobs)
            choices = [_choice_chunks(job, framing(i), counts,
                                      calling.CallStream(plan.tools, tokenizer) if calls_wanted else None)
                       for i, job in enumerate(jobs)]
            events = _stream(choices, counts, prompt_tokens, _include_usage(body), framing(0))
            return streaming.JobStreamingResponse(events, on_close=cancel_all(jobs), media_type="text/event-stream")
        outcomes = await streaming.collect(request, jobs, prompt_tokens)
        choices = []
        for index, outcome in enumerate(outcomes):
            message, reason = wire.AssistantMessage(content=outcome.text), outcome.finish_reason
            if calls_wanted:
                content, calls = await run_in_threadpool(calling.parse, outcome.text, plan.tools, tokenizer)
                if calls:
                    message = wire.AssistantMessage(content=content or None, tool_calls=wire_calls(calls))
                    reason = "tool_calls"
            logprobs = await run_in_threadpool(LogprobText(tokenizer).chat, outcome.logprobs) \
                if logprobs_wanted else None
            choices.append(wire.ChatChoice(index=index, message=message, finish_reason=reason, logprobs=logprobs,
                                           error=outcome.error))
        return wire.ChatCompletion(id=ident, created=created, model=body.model, choices=choices,
                                   usage=usage(prompt_tokens, sum(o.completion_tokens for o in outcomes)))

    @api.post("/completions", response_model=wire.Completion, response_model_exclude_none=True,
              responses=stream_doc("Completion"))
    async def completions(body: wire.CompletionRequest, request: Request):
        params = sampling(body, body.max_tokens, logprobs=body.logprobs)
        prompt = Prompt(text=body.prompt if isinstance(body.prompt, str) else body.prompt[0])
        ident, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
        jobs, prompt_tokens = await submit(state, request, body.model, prompt, params, body.n or 1)
        tokenizer = state.engine.resident(jobs[0].route.base).tokenizer if params.logprobs is not None else None

        def framing(index: int) -> CompletionFraming:
            return CompletionFraming(ident, created, body.model, index,
                                     LogprobText(tokenizer) if tokenizer is not None else None)

        if body.stream:
            counts = [0] * len(jobs)
            choices = [_choice_chunks(job, framing(i), counts) for i, job in enumerate(jobs)]
            events = _stream(choices, counts, prompt_tokens, _include_usage(body), framing(0))
            return streaming.JobStreamingResponse(events, on_close=cancel_all(jobs), media_type="text/event-stream")
        outcomes = await streaming.collect(request, jobs, prompt_tokens)
        choices = []
        for index, outcome in enumerate(outcomes):
            logprobs = await run_in_threadpool(LogprobText(tokenizer).completion, outcome.logprobs) \
                if tokenizer is not None else None
            choices.append(wire.CompletionChoice(index=index, text=outcome.text, finish_reason=outcome.finish_reason,
                                                 logprobs=logprobs, error=outcome.error))
        return wire.Completion(id=ident, created=created, model=body.model, choices=choices,
                               usage=usage(prompt_tokens, sum(o.completion_tokens for o in outcomes)))

    @api.post("/embeddings", response_model=wire.EmbeddingList)
    async def embeddings(body: wire.EmbeddingRequest) -> wire.EmbeddingList:
        texts = [body.input] if isinstance(body.input, str) else body.input
        route = await run_in_threadpool(state.route, body.model)
        result = await run_in_threadpool(lambda: embedder.embed(route, texts, dimensions=body.dimensions))
        data = [wire.Embedding(index=i, embedding=_encoded(vector, body.encoding_format))
                for i, vector in enumerate(result.vectors)]
        tokens = sum(result.token_counts)
        return wire.EmbeddingList(data=data, model=body.model,
                                  usage=wire.EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))

    return api


def _encoded(vector, encoding: str) -> list[float] | str:
    """A float32 vector as JSON floats, or base64 of its little-endian bytes (OpenAI's format)."""
    if encoding == "base64":
        return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def _include_usage(body: wire.SamplingFields) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


@dataclass
class ChatFraming:
    """The chunks of one choice of a streamed chat completion, as OpenAI shapes them."""

    ident: str
    created: int
    model: str
    index: int = 0
    logprobs: LogprobText | None = None   # with `logprobs: true`

    def _chunk(self, choices: list[wire.ChunkChoice], used: wire.Usage | None = None) -> dict:
        return wire.ChatCompletionChunk(id=self.ident, created=self.created, model=self.model, choices=choices,
                                        usage=used).model_dump(exclude_none=True)

    def _choice(self, content: str | None, reason: str | None = None, role: str | None = None,
                error: str | None = None, calls: list[wire.ChunkToolCall] | None = None,
                items: list[TokenLogprob] = ()) -> list:
        delta = wire.ChunkDelta(role=role, content=content, tool_calls=calls)
        logprobs = self.logprobs.chat(items) if self.logprobs is not None and items else None
        return [wire.ChunkChoice(index=self.index, delta=delta, finish_reason=reason, logprobs=logprobs, error=error)]

    def opening(self) -> dict | None:
        return self._chunk(self._choice("", role="assistant"))

    def text(self, text: str, items: list[TokenLogprob] = ()) -> dict:
        return self._chunk(self._choice(text, items=items))

    def tool_calls(self, calls: list[calling.Call]) -> dict:
        """All the calls in one chunk, each whole (OpenAI may split arguments; clients join them)."""
        chunked = [wire.ChunkToolCall(index=i, **call.model_dump()) for i, call in enumerate(wire_calls(calls))]
        return self._chunk(self._choice(None, calls=chunked))

    def end(self, reason: str, error: str | None = None, items: list[TokenLogprob] = ()) -> dict:
        return self._chunk(self._choice(None, reason, error=error, items=items))

    def usage(self, used: wire.Usage) -> dict:
        return self._chunk([], used)


@dataclass
class CompletionFraming:
    """The chunks of one choice of a streamed text completion."""

    ident: str
    created: int
    model: str
    index: int = 0
    logprobs: LogprobText | None = None   # with `logprobs`

    def _chunk(self, choices: list[wire.CompletionChoice], used: wire.Usage | None = None) -> dict:
        return wire.Completion(id=self.ident, created=self.created, model=self.model, choices=choices,
                               usage=used).model_dump(exclude_none=True)

    def _choice(self, text: str, reason: str | None = None, error: str | None = None,
                items: list[TokenLogprob] = ()) -> list:
        logprobs = self.logprobs.completion(items) if self.logprobs is not None and items else None
        return [wire.CompletionChoice(index=self.index, text=text, finish_reason=reason, logprobs=logprobs,
                                      error=error)]

    def opening(self) -> dict | None:
        return None

    def text(self, text: str, items: list[TokenLogprob] = ()) -> dict:
        return self._chunk(self._choice(text, items=items))

    def end(self, reason: str, error: str | None = None, items: list[TokenLogprob] = ()) -> dict:
        return self._chunk(self._choice("", reason, error, items))

    def usage(self, used: wire.Usage) -> dict:
        return self._chunk([], used)


async def _choice_chunks(job: Job, framing: ChatFraming | CompletionFraming, counts: list[int],
                         watcher: calling.CallStream | None = None) -> AsyncIterator[dict]:
    """The chunks of one choice: an optional opening chunk, one per piece of text (with the
    log-probabilities of the tokens it completes, when asked), then one with the finish reason;
    its tokens are counted in counts[framing.index]. With a `watcher` (a chat offering tools),
    text that may be a call waits for the end: then it goes out as one tool-calls chunk
    (finish_reason "tool_calls") or as text."""
    if (opening := framing.opening()) is not None:
        yield opening
    owed: list[TokenLogprob] = []     # tokens whose text has not gone out yet
    async for delta in streaming.deltas(job):
        counts[framing.index] += delta.token_id is not None
        if delta.logprob is not None:
            owed.append(delta.logprob)
        text, reason = delta.text, delta.finish_reason
        if watcher is not None:
            text = watcher.feed(text)
        if text:
            yield framing.text(text, owed)
            owed = []
        if reason and watcher is not None:
            rest, calls = await run_in_threadpool(watcher.finish)
            if rest:
                yield framing.text(rest, owed)
                owed = []
            if calls:
                yield framing.tool_calls(calls)
                reason = "tool_calls"
        if reason:
            yield framing.end(reason, delta.error, owed)


async def _stream(choices: list[AsyncIterator[dict]], counts: list[int], prompt_tokens: int, include_usage: bool,
                  framing: ChatFraming | CompletionFraming) -> AsyncIterator[bytes]:
    """SSE for a request's choices, their chunks as they come; the usage chunk if asked, then
    [DONE]. A failure mid-stream is one error event."""
    try:
        async for chunk in streaming.merged(choices):
            yield streaming.sse(chunk)
        if include_usage:
            yield streaming.sse(framing.usage(usage(prompt_tokens, sum(counts))))
    except errors.ClientGone:
        return
    except Exception as exc:
        yield streaming.sse(errors.stream_payload(exc))
    yield streaming.sse("[DONE]")


def _models(state: DaemonState) -> wire.ModelList:
    cards = []
    for base in state.store.bases():
        cards.append(wire.ModelCard(id=base["name"], created=int(base["created_at"]), kind="base", base=base["name"]))
    for row in state.store.names():
        cards.append(wire.ModelCard(id=row["name"], created=int(row["created_at"]), kind=row["kind"], base=row["base"]))
    return wire.ModelList(data=cards)


def _model(state: DaemonState, model: str) -> wire.ModelCard:
    """One card of the list, by id (GET /v1/models/{id}, the SDK's `models.retrieve`)."""
    card = next((card for card in _models(state).data if card.id == model), None)
    if card is None:
        raise AdapterNotFound(f"model {model[:80]!r} does not exist", hint="see GET /v1/models")
    return card

