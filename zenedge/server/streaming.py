"""The async side of a generation job: waiting for it, streaming it, and noticing when the client leaves.

A handler first awaits the job's start (queued → running), so that errors known before the first
token (a variant that fails to load, an empty prompt) still get a proper HTTP status; only then
does a streamed response commit to 200. A client that disconnects cancels its job, whether it is
still waiting in the queue or generating.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Sequence

from starlette.requests import Request
from starlette.responses import StreamingResponse

from zenedge.runtime.generate import Delta
from zenedge.runtime.sampling import TokenLogprob
from zenedge.server.errors import ClientGone
from zenedge.server.scheduler import Job


@dataclass
class Outcome:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None   # with finish_reason "error"
    logprobs: list[TokenLogprob] = field(default_factory=list)   # with SamplingParams.logprobs


@asynccontextmanager
async def cancel_on_disconnect(request: Request, *jobs: Job):
    """While inside, a client disconnect cancels the `jobs` and wakes whoever waits on their events."""

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                for job in jobs:
                    job.cancel()
                    job.events.put_nowait(("gone", None))
                return

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()


async def next_event(job: Job) -> tuple[str, Any]:
    kind, value = await job.events.get()
    if kind == "error":
        raise value
    if kind == "gone":
        raise ClientGone()
    return kind, value


async def started(request: Request, job: Job) -> int:
    """Wait until the job runs; return its prompt token count (or raise its error)."""
    async with cancel_on_disconnect(request, job):
        _, prompt_tokens = await next_event(job)
    return prompt_tokens


async def deltas(job: Job) -> AsyncIterator[Delta]:
    """The job's deltas until its finish reason (after `started`)."""
    while True:
        _, delta = await next_event(job)
        yield delta
        if delta.finish_reason:
            return


async def collect(request: Request, jobs: Sequence[Job], prompt_tokens: int) -> list[Outcome]:
    """Run started jobs (a request's choices) to their ends for a non-streamed answer."""
    async with cancel_on_disconnect(request, *jobs):
        return list(await asyncio.gather(*(_outcome(job, prompt_tokens) for job in jobs)))


async def _outcome(job: Job, prompt_tokens: int) -> Outcome:
    outcome = Outcome("", "length", prompt_tokens, 0)
    parts = []
    async for delta in deltas(job):
        parts.append(delta.text)
        outcome.completion_tokens += delta.token_id is not None
        outcome.finish_reason = delta.finish_reason or outcome.finish_reason
        outcome.error = delta.error or outcome.error
        if delta.logprob is not None:
            outcome.logprobs.append(delta.logprob)
    outcome.text = "".join(parts)
    return outcome


async def merged(streams: Sequence[AsyncIterator[Any]]) -> AsyncIterator[Any]:
    """The items of several async iterators as they come (a request's choices, streamed
    together); the first error raised by any of them is raised here, and leaving early stops all."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                await queue.put((item, None))
        except Exception as exc:
            await queue.put((None, exc))
        finally:
            await queue.put((done, None))

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            item, exc = await queue.get()
            if exc is not None:
                raise exc
            if item is done:
                running -= 1
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


def sse(payload: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event; `event` names it (the Responses API names each event by its type)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    named = f"event: {event}\n" if event else ""
    return f"{named}data: {data}\n\n".encode()


def ndjson(payload: dict[str, Any]) -> bytes:
    return (json.dumps(payload, separators=(",", ":"), default=str) + "\n").encode()


class JobStreamingResponse(StreamingResponse):
    """A streamed response that runs `on_close` however it ends (finished, client gone, shutdown):
    Starlette closes streams differently across ASGI versions, so the body generator's own
    `finally` is not enough to cancel a job."""

    def __init__(self, content, *, on_close: Callable[[], None], media_type: str):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, media_type=media_type, headers=headers)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
