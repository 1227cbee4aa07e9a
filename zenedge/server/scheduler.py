"""The scheduler: a bounded queue of generation jobs and one worker thread that runs them in batches.

The worker takes the oldest waiting job and every other waiting job on the same base (up to
`max_batch`), and runs them as ONE mixed batch through `generate()`: each row carries its own
variant, sampling parameters and cancellation event. Between generate()'s ticks, jobs on the
running batch's base join it while it has room (`max_batch` rows running), as long as no job on
another base has waited longer: a request arriving while a long one decodes, or prefills a long
prompt chunk by chunk, starts within a tick instead of waiting for the whole batch. Each tick's
deltas go back to their jobs' asyncio queues with one `call_soon_threadsafe` per tick, so the
event loop never waits on torch.

A prompt that does not fit the base's context is refused per job, before its "start" (an HTTP
400), never failing its batch (generate.check_fits). Variant loads go through the engine's delta
cache (single-flight). A job whose client leaves is cancelled: while waiting it is dropped, while
running its row ends at the next tick.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from zenedge.runtime.engine import Engine, Prompt
from zenedge.runtime.generate import Delta, GenerationRequest, SamplingParams, generate
from zenedge.runtime.router import Route
from zenedge.server.errors import QueueFull, ShuttingDown

log = logging.getLogger("zenedge.server")


@dataclass(eq=False)
class Job:
    route: Route
    prompt: Prompt
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # ("start", n) | ("delta", Delta) | ("error", exc)
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: bool = False  # set by the worker once the job's last event is sent

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class Counters:
    batches: int = 0
    largest_batch: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0


class Scheduler:
    def __init__(self, engine: Engine, *, max_queue: int, max_batch: int = 8):
        self.engine = engine
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.counters = Counters()
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._cond = threading.Condition()
        self._accepting = True
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="zenedge-scheduler", daemon=True)

    # -- event-loop side -----------------------------------------------------------------------
    def submit(self, route: Route, prompt: Prompt, params: SamplingParams) -> Job:
        job = Job(route, prompt, params, asyncio.get_running_loop())
        with self._cond:
            if not self._accepting:
                raise ShuttingDown("the daemon is shutting down", hint="retry once it is back")
            self._drop_cancelled()
            if len(self._waiting) >= self.max_queue:
                self.counters.rejected += 1
                raise QueueFull(f"{len(self._waiting)} requests are already waiting (server.max_queue)",
                                hint="retry shortly")
            self._waiting.append(job)
            self._cond.notify()
        return job

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {"queued": sum(not j.cancelled.is_set() for j in self._waiting),
                    "running": sum(not j.done for j in self._running),
                    "max_queue": self.max_queue, "max_batch": self.max_batch, **vars(self.counters)}

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop_accepting(self) -> None:
        with self._cond:
            self._accepting = False

    def cancel_all(self) -> None:
        """End every job now: waiting ones fail with ShuttingDown, running rows stop at the next step
        (their streams still end properly, with finish_reason "cancelled")."""
        with self._cond:
            self._accepting = False
            waiting, self._waiting = list(self._waiting), deque()
            for job in self._running:
                job.cancel()
        self._deliver([(job, ("error", ShuttingDown("the daemon is shutting down"))) for job in waiting])

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel everything and wait for the worker to finish its step."""
        self.cancel_all()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- worker side -----------------------------------------------------------------------------
    def _drop_cancelled(self) -> None:
        kept = deque(j for j in self._waiting if not j.cancelled.is_set())
        self.counters.cancelled += len(self._waiting) - len(kept)
        self._waiting = kept

    def _take(self, room: int, base: str | None = None) -> list[Job]:
        """Waiting jobs to run, in arrival order, at most `room`. A new batch (`base` None): the
        oldest job and the waiting jobs on its base. Joining a running batch on `base`: its jobs
        that arrived before any waiting job on another base (which would otherwise wait on)."""
        self._drop_cancelled()
        joining = base is not None
        if not joining:
            base = self._waiting[0].route.base
        taken, kept, passed_other = [], deque(), False
        for job in self._waiting:
            if job.route.base == base and len(taken) < room and not (joining and passed_other):
                taken.append(job)
            else:
                passed_other = passed_other or job.route.base != base
                kept.append(job)
        self._waiting = kept
        return taken

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not any(not j.cancelled.is_set() for j in self._waiting):
                    self._cond.wait(timeout=1.0)
                    self._drop_cancelled()
                if self._stopping:
                    return
                batch = self._take(self.max_batch)
                self._running = list(batch)             # and the jobs that join it
                self.counters.batches += 1
                self.counters.largest_batch = max(self.counters.largest_batch, len(batch))
            try:
                self._run(batch)
            except BaseException as exc:  # the worker must outlive any one batch
                log.error("batch of %d failed", len(batch), exc_info=exc)
                with self._cond:
                    running = list(self._running)
                self._deliver([(job, ("error", exc)) for job in running if not job.done], finishing=True)
            finally:
                with self._cond:
                    self._running = []

    def _run(self, batch: list[Job]) -> None:
        engine, base = self.engine, batch[0].route.base
        try:
            resident = engine.resident(base)
        except Exception as exc:
            self._deliver([(job, ("error", exc)) for job in batch], finishing=True)
            return
        jobs: list[Job] = []                # generate()'s Delta.index → job
        requests: list[GenerationRequest] = []
        started = time.perf_counter()
        with ExitStack() as stack:
            def start(new: list[Job]) -> list[GenerationRequest]:
                """Prepare jobs for the batch (a job that cannot run gets its error now) and start them."""
                ready = [(job, request) for job in new if (request := self._prepare(job, resident)) is not None]
                for job, _ in ready:
                    stack.enter_context(engine.router.inflight(job.route))
                    jobs.append(job)
                self._deliver([(job, ("start", len(request.input_ids))) for job, request in ready])
                return [request for _, request in ready]

            def admit() -> list[GenerationRequest]:
                with self._cond:
                    running = sum(not job.done for job in jobs)
                    new = self._take(self.max_batch - running, base) if self._accepting and self._waiting else []
                    self._running.extend(new)
                    self.counters.largest_batch = max(self.counters.largest_batch, running + len(new))
                return start(new) if new else []

            requests = start(batch)
            if requests:
                for deltas in generate(resident, requests, admit=admit):
                    self._deliver([(jobs[d.index], ("delta", d)) for d in deltas])
        log.debug("batch of %d on %s in %.2fs", len(jobs), base, time.perf_counter() - started)

    def _prepare(self, job: Job, resident) -> GenerationRequest | None:
        """The job's request (prompt encoded and checked against the context, variant loaded), or
        None after delivering its error."""
        try:
            return self.engine.request(job.route, resident, job.prompt, job.params, job.cancelled)
        except Exception as exc:
            self._deliver([(job, ("error", exc))], finishing=True)
            return None

    def _deliver(self, items: list[tuple[Job, tuple]], finishing: bool = False) -> None:
        """Hand events to their jobs' event loops: one callback per loop per call."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, tuple]]] = {}
        for job, event in items:
            kind, value = event
            if finishing or kind == "error" or (kind == "delta" and value.finish_reason):
                job.done = True
                self._count(event)
            by_loop.setdefault(job.loop, []).append((job, event))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:
                pass  # that loop is closed: its clients are gone

    def _count(self, event: tuple) -> None:
        kind, value = event
        if kind == "error":
            self.counters.failed += 1
        elif isinstance(value, Delta) and value.finish_reason == "cancelled":
            self.counters.cancelled += 1
        else:
            self.counters.completed += 1


def _put_all(items: list[tuple[Job, tuple]]) -> None:
    for job, event in items:
        job.events.put_nowait(event)
