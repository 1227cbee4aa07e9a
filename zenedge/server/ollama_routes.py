"""Ollama-compatible endpoints, so that clients written for Ollama (its official libraries, the
node inside Hanzo Desktop, …) work against zenedge unchanged: /api/tags, /api/show, /api/version,
/api/chat, /api/generate, /api/embed, /api/embeddings, /api/delete. (/api/pull and /api/ps are
shared with the native API: native_routes.py answers both shapes in one body.)

The mapping:
- `model` is a profile or a base, as on /v1; `NAME:latest` means NAME (zenedge names have no tags).
- Generation goes through the same scheduler as /v1 (batching, cancellation, queue limits).
  `options`: num_predict → max tokens (absent or ≤ 0: the /v1 default, 256, where Ollama would run
  to the end of the context), temperature and top_p (Ollama's defaults 0.8 and 0.9), seed, stop,
  top_k, min_p, repeat_penalty and repeat_last_n, presence and frequency penalties (runtime/
  sampling.py; each off unless sent). The runner's settings (num_ctx, num_thread, …) are accepted
  and left to zenedge; samplers zenedge lacks (mirostat, typical_p, tfs_z) only at their "off"
  value; any other field is refused, naming it (api/fields.py).
- `keep_alive: 0` drops the profile's variant from the delta cache when the request ends; other
  values leave it to the cache's own policy (rate-weighted LRU). The base always stays resident.
- An empty prompt (or no messages, or an empty embedding input) loads the model and returns
  (`done_reason: "load"`; with keep_alive 0, `"unload"`), as Ollama does.
- `format` ("json" or a JSON schema) decodes under a grammar (runtime/grammar.py): the answer
  always parses and validates.
- `tools` are rendered into the prompt; a call comes back in `message.tool_calls` (arguments as
  an object) when the answer parses as one and its arguments validate, else the answer is text.
  Ollama has no `tool_choice`: a call is never forced here (it is on /v1).
- What zenedge cannot honour (images, thinking, suffix, custom templates, a `context` to continue) is refused
  with a 400 rather than silently ignored. `logprobs` (and `top_logprobs`, up to 20) come on each line,
  for the tokens whose text it carries, in Ollama's shape (token, logprob, bytes, top_logprobs).
- Streams are NDJSON, Ollama's default. Errors are Ollama's `{"error": "message"}` with the
  daemon's statuses (400 bad request, 404 unknown model, 503 queue full); the security middleware's
  own refusals (401, 403, 413) keep zenedge's body, as on every route.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Sequence

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import Response

from zenedge import __version__, bases
from zenedge.api import wire
from zenedge.errors import AdapterNotFound, InvalidInput, InvalidName, ZenedgeError
from zenedge.runtime import tools as calling
from zenedge.runtime.embed import Embedder
from zenedge.runtime.engine import Prompt
from zenedge.runtime.generate import SamplingParams
from zenedge.runtime.grammar import Grammar
from zenedge.runtime.router import Route
from zenedge.runtime.sampling import TokenLogprob
from zenedge.server import errors, ollama_models, streaming
from zenedge.server.logprobs import LogprobText, logprobs_asked
from zenedge.server.openai_routes import DEFAULT_MAX_TOKENS
from zenedge.server.scheduler import Job
from zenedge.server.state import DaemonState

TEMPERATURE, TOP_P = 0.8, 0.9  # Ollama's defaults
NDJSON = "application/x-ndjson"
ERRORS = {status: {"model": wire.OllamaError, "description": what} for status, what in {
    400: "malformed or invalid request, or a feature zenedge does not support", 404: "unknown model",
    422: "not sent: a body that does not fit the schema is a 400 here, as in Ollama",
    503: "queue full (see Retry-After) or shutting down"}.items()}


def _text(message: str, hint: str | None) -> str:
    return f"{message} ({hint})" if hint else message


def error_body(exc: ZenedgeError) -> dict[str, str]:
    """Ollama's error body: one string."""
    return {"error": _text(exc.message, exc.hint)}


def error_response(exc: BaseException) -> Response:
    return errors.response(exc, shape=error_body)


def error_line(exc: BaseException) -> dict[str, str]:
    """A failure after a stream began: a last line `{"error": ...}`, as Ollama sends it."""
    detail = errors.stream_payload(exc)["error"]  # logs an unexpected error, never shows it
    return {"error": _text(detail["message"], detail.get("hint"))}


class OllamaRoute(APIRoute):
    """A route whose errors come in Ollama's shape. A body that does not fit the schema is a 400
    (Ollama's status) where the native routes say 422."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                problem = errors.validation_error(list(exc.errors()))
                return error_response(problem if problem.http_status == 400 else InvalidInput(problem.message))
            except HTTPException as exc:
                if exc.status_code != 400:
                    raise
                return error_response(errors.unparsable_body(exc.__cause__))  # FastAPI's own parse failure
            except errors.ClientGone:
                raise
            except Exception as exc:
                return error_response(exc)

        return handle


def model_name(name: str) -> str:
    return name.removesuffix(":latest")


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION = re.compile(rf"[-+]?(?:{_DURATION_PART.pattern})+")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: float | str | None) -> float | None:
    """Ollama's keep_alive: seconds as a number, or a Go duration ("5m", "1h30m", "0", "-1")."""
    if value is None or isinstance(value, (int, float)):
        return value
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if not _DURATION.fullmatch(text):
        raise InvalidInput(f"keep_alive {value[:32]!r} is not a duration", hint='e.g. "5m", 300, 0 or -1')
    seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text))
    return -seconds if text.startswith("-") else seconds


def sampling(options: wire.OllamaOptions | None, grammar: Grammar | None = None,
             logprobs: int | None = None) -> SamplingParams:
    o = options or wire.OllamaOptions()
    return SamplingParams(
        grammar=grammar,
        logprobs=logprobs,
        max_tokens=o.num_predict if o.num_predict and o.num_predict > 0 else DEFAULT_MAX_TOKENS,
        temperature=TEMPERATURE if o.temperature is None else o.temperature,
        top_p=TOP_P if o.top_p is None else o.top_p,
        seed=o.seed,
        stop=tuple(o.stop or ()),
        top_k=o.top_k or 0,
        min_p=o.min_p or 0.0,
        repeat_penalty=1.0 if o.repeat_penalty is None else o.repeat_penalty,
        repeat_last_n=64 if o.repeat_last_n is None else o.repeat_last_n,
        presence_penalty=o.presence_penalty or 0.0,
        frequency_penalty=o.frequency_penalty or 0.0,
    )


def refuse_unsupported(body: wire.OllamaGenerationFields, **fields: Any) -> None:
    """What zenedge cannot honour is an error, not an answer to a different question."""
    if body.think not in (None, False):
        raise InvalidInput(f"{body.model[:80]!r} does not support thinking")
    for what, value in fields.items():
        if value:
            raise InvalidInput(f"`{what}` is not supported by zenedge")


def format_grammar(format: str | dict | None) -> Grammar | None:
    """Ollama's `format`: "json" (any JSON object) or a JSON schema; empty: free text."""
    if not format:
        return None
    if format == "json":
        return Grammar.json_object("format")
    return Grammar.json_schema(format, "format")


def now() -> str:
    return ollama_models.timestamp(time.time())


@dataclass
class Timings:
    """One request's counts and durations in nanoseconds, as Ollama reports them."""

    begun: int = field(default_factory=time.perf_counter_ns)
    started: int = 0       # the job left the queue (base and variant loaded, prompt encoded)
    first: int = 0         # the first token came back (prompt evaluated)
    ended: int = 0
    prompt_tokens: int = 0
    tokens: int = 0

    def stats(self) -> dict[str, int]:
        end = self.ended or time.perf_counter_ns()
        started = self.started or end
        first = self.first or end
        return {"total_duration": end - self.begun, "load_duration": started - self.begun,
                "prompt_eval_count": self.prompt_tokens, "prompt_eval_duration": first - started,
                "eval_count": self.tokens, "eval_duration": end - first}


@dataclass
class Framing:
    """The lines of /api/chat (`message`) or /api/generate (`response`)."""

    model: str
    chat: bool
    logprobs: LogprobText | None = None   # with `logprobs: true`

    def line(self, text: str, done: bool = False, calls: Sequence[calling.Call] = (),
             items: Sequence[TokenLogprob] = (), **extra: Any) -> dict[str, Any]:
        """A line of `text` (and `calls`); `items`, the log-probabilities of the tokens it completes."""
        body: dict[str, Any] = {"model": self.model, "created_at": now()}
        if self.chat:
            body["message"] = {"role": "assistant", "content": text}
            if calls:   # Ollama's shape: arguments as an object, no ids
                body["message"]["tool_calls"] = [{"function": {"index": i, "name": c.name, "arguments": c.arguments}}
                                                 for i, c in enumerate(calls)]
        else:
            body["response"] = text
        if self.logprobs is not None and items:
            body["logprobs"] = [entry.model_dump() for entry in self.logprobs.chat(list(items)).content]
        return {**body, "done": done, **extra}


def ndjson_doc(line: str) -> dict:
    return {200: {"description": f"one {line}; with `stream: true` (the default), NDJSON lines of {line}, the "
                                 f"last with `done: true` and the stats (or an OllamaError line)",
                  "content": {NDJSON: {"schema": {"$ref": f"#/components/schemas/{line}"}}}}}


def router(state: DaemonState, embedder: Embedder) -> APIRouter:
    api = APIRouter(tags=["ollama"], route_class=OllamaRoute, responses=ERRORS)

    @api.get("/api/version", response_model=wire.OllamaVersion)
    async def version() -> dict:
        return {"version": __version__}

    @api.get("/api/tags", response_model=wire.OllamaTags)
    async def tags() -> dict:
        return {"models": await run_in_threadpool(ollama_models.tags, state.store)}

    @api.post("/api/show", response_model=wire.OllamaShowResponse)
    async def show(body: wire.OllamaShowRequest) -> dict:
        return await run_in_threadpool(ollama_models.show, state.store, model_name(body.target))

    @api.delete("/api/delete", responses={200: {"description": "removed (an empty body, as Ollama answers)"}})
    async def delete(body: wire.OllamaDeleteRequest) -> Response:
        name = model_name(body.target)
        await state.jobs.run(f"delete {name}", lambda progress: _delete(state, name))
        return Response(status_code=200)

    @api.post("/api/chat", response_model=wire.OllamaChatResponse, response_model_exclude_none=True,
              responses=ndjson_doc("OllamaChatResponse"))
    async def chat(body: wire.OllamaChatRequest, request: Request):
        refuse_unsupported(body, images=any(m.images for m in body.messages))
        framing = Framing(body.model, chat=True)
        if not body.messages:
            reason = await _warm(state, await _route(state, body.model), body.keep_alive)
            return framing.line("", done=True, done_reason=reason)
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []]
        if tools:   # Ollama has no tool_choice: a call is read back when the answer is one
            await run_in_threadpool(calling.call_grammar, tools)   # every tool's schema checked: a 400 now
        prompt = Prompt(messages=[m.for_template() for m in body.messages], tools=tools)
        return await _generate(state, request, body, prompt, framing, tools)

    @api.post("/api/generate", response_model=wire.OllamaGenerateResponse, response_model_exclude_none=True,
              responses=ndjson_doc("OllamaGenerateResponse"))
    async def generate(body: wire.OllamaGenerateRequest, request: Request):
        refuse_unsupported(body, images=body.images, suffix=body.suffix, template=body.template,
                           context=body.context)
        framing = Framing(body.model, chat=False)
        if not body.prompt:
            reason = await _warm(state, await _route(state, body.model), body.keep_alive)
            return framing.line("", done=True, done_reason=reason)
        if body.raw:
            prompt = Prompt(text=body.prompt)
        else:
            system = [{"role": "system", "content": body.system}] if body.system else []
            prompt = Prompt(messages=[*system, {"role": "user", "content": body.prompt}])
        return await _generate(state, request, body, prompt, framing)

    @api.post("/api/embed", response_model=wire.OllamaEmbedResponse)
    async def embed(body: wire.OllamaEmbedRequest) -> dict:
        timings = Timings()
        texts = [body.input] if isinstance(body.input, str) else body.input
        route = await _route(state, body.model)
        if texts == [""]:  # Ollama's way to load a model without embedding anything
            await _warm(state, route, body.keep_alive)
            return {"model": body.model, "embeddings": [], "prompt_eval_count": 0, **_durations(timings)}
        result = await _embed(state, embedder, route, texts, body.keep_alive, truncate=body.truncate,
                              dimensions=body.dimensions)
        return {"model": body.model, "embeddings": result.vectors.tolist(),
                "prompt_eval_count": sum(result.token_counts), **_durations(timings, result.load_ns)}

    @api.post("/api/embeddings", response_model=wire.OllamaEmbeddingsResponse)
    async def embeddings(body: wire.OllamaEmbeddingsRequest) -> dict:
        route = await _route(state, body.model)
        if not body.prompt:
            await _warm(state, route, body.keep_alive)
            return {"embedding": []}
        result = await _embed(state, embedder, route, [body.prompt], body.keep_alive, truncate=True)
        return {"embedding": result.vectors[0].tolist()}

    return api


async def _route(state: DaemonState, model: str) -> Route:
    return await run_in_threadpool(state.route, model_name(model))


def _delete(state: DaemonState, name: str) -> None:
    if state.store.base(name) or bases.find_base(state.store, name):
        raise InvalidInput(f"{name!r} is a base model: only profiles are deleted through the API")
    try:
        state.store.remove_name(name)
    except InvalidName:
        raise AdapterNotFound(f"model {name[:80]!r} not found") from None
    state.sync_cache()


def _release(state: DaemonState, route: Route, keep_alive: float | str | None) -> None:
    """keep_alive 0: the profile's variant leaves the delta cache now (a batch still using it keeps
    its own reference). The base stays resident whatever keep_alive says."""
    if route.adapter is not None and keep_alive_seconds(keep_alive) == 0:
        state.engine.cache.drop(route.adapter["id"])


async def _warm(state: DaemonState, route: Route, keep_alive: float | str | None) -> str:
    """An empty request: load the base and the variant ("load"), or with keep_alive 0 drop the
    variant ("unload")."""
    if keep_alive_seconds(keep_alive) == 0:
        _release(state, route, keep_alive)
        return "unload"
    await run_in_threadpool(lambda: (state.engine.resident(route.base), state.engine.variant(route)))
    return "load"


async def _embed(state: DaemonState, embedder: Embedder, route: Route, texts: list[str],
                 keep_alive: float | str | None, **options: Any):
    keep_alive_seconds(keep_alive)  # a malformed keep_alive is refused before any work
    try:
        return await run_in_threadpool(lambda: embedder.embed(route, texts, **options))
    finally:
        _release(state, route, keep_alive)


def _durations(timings: Timings, load_ns: int = 0) -> dict[str, int]:
    return {"total_duration": time.perf_counter_ns() - timings.begun, "load_duration": load_ns}


async def _generate(state: DaemonState, request: Request, body: wire.OllamaGenerationFields, prompt: Prompt,
                    framing: Framing, tools: list[dict] | None = None):
    """Submit to the scheduler, wait for the start (so that early errors keep their HTTP status),
    then stream NDJSON or collect one answer. With `tools`, what may be a call is held back until
    the end, then sent as `message.tool_calls` or as text (runtime/tools.CallStream)."""
    params = sampling(body.options, await run_in_threadpool(format_grammar, body.format),
                      logprobs_asked(body.logprobs, body.top_logprobs))
    keep_alive_seconds(body.keep_alive)
    timings = Timings()
    route = await _route(state, body.model)
    job = state.scheduler.submit(route, prompt, params)
    timings.prompt_tokens = await streaming.started(request, job)
    timings.started = time.perf_counter_ns()
    resident_tokenizer = state.engine.resident(route.base).tokenizer
    tokenizer = resident_tokenizer if tools else None
    if params.logprobs is not None:
        framing = replace(framing, logprobs=LogprobText(resident_tokenizer))
    if body.stream:
        watcher = calling.CallStream(tools, tokenizer) if tokenizer is not None else None

        def close() -> None:
            job.cancel()
            _release(state, route, body.keep_alive)

        return streaming.JobStreamingResponse(_lines(job, timings, framing, watcher), on_close=close,
                                              media_type=NDJSON)
    parts, items, end = [], [], {"done_reason": "stop"}
    try:
        async with streaming.cancel_on_disconnect(request, job):
            async for delta in _timed(job, timings):
                parts.append(delta.text)
                items += [delta.logprob] if delta.logprob is not None else []
                end = _end(delta) or end
    finally:
        _release(state, route, body.keep_alive)
    text, calls = "".join(parts), []
    if tokenizer is not None:
        text, calls = await run_in_threadpool(calling.parse, text, tools, tokenizer)
    return framing.line(text, done=True, calls=calls, items=items, **end, **timings.stats())


def _end(delta) -> dict[str, str] | None:
    """The last line's reason (and error, when the row ended on one), or None mid-answer."""
    if not delta.finish_reason:
        return None
    return {"done_reason": delta.finish_reason, **({"error": delta.error} if delta.error else {})}


async def _timed(job: Job, timings: Timings):
    async for delta in streaming.deltas(job):
        timings.first = timings.first or time.perf_counter_ns()
        timings.tokens += delta.token_id is not None
        if delta.finish_reason:
            timings.ended = time.perf_counter_ns()
        yield delta


async def _lines(job: Job, timings: Timings, framing: Framing,
                 watcher: calling.CallStream | None = None) -> AsyncIterator[bytes]:
    """A line per piece of text, then a last line with `done`, the reason and the stats; a failure
    mid-stream is one error line. Calls (with a `watcher`) go in one line before the last."""
    end, owed = {"done_reason": "stop"}, []   # owed: tokens whose text has not gone out yet
    try:
        async for delta in _timed(job, timings):
            owed += [delta.logprob] if delta.logprob is not None else []
            text = delta.text if watcher is None else watcher.feed(delta.text)
            if text:
                yield streaming.ndjson(framing.line(text, items=owed))
                owed = []
            if delta.finish_reason and watcher is not None:
                rest, calls = await run_in_threadpool(watcher.finish)
                if rest or calls:
                    yield streaming.ndjson(framing.line(rest, calls=calls, items=owed))
                    owed = []
            end = _end(delta) or end
        yield streaming.ndjson(framing.line("", done=True, items=owed, **end, **timings.stats()))
    except errors.ClientGone:
        return
    except Exception as exc:
        yield streaming.ndjson(error_line(exc))
