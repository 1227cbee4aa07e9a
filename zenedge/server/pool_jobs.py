"""The daemon's pool work: one job at a time, in the order asked, never timed out.

Pulls, imports, removals, budget changes and maintenance change the pool under its writer lock.
They queue here rather than race for the lock from request threads, where the loser would give up
when the lock's wait ran out ("the pool is busy"). A job that waits tells its client so through its
progress callback ("waiting for pull coder", one line each time the queue moves).

At shutdown the jobs not yet started are refused (ShuttingDown); the running one gets the grace
period, then is stopped at its next safe point: a progress event of a phase before its commit (downloading, ranking, merging,
gating) raises ShuttingDown inside it, so nothing is committed and the pool stays as it was (a
download resumes later). A commit in progress is never interrupted.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from zenedge.server.errors import ShuttingDown

log = logging.getLogger("zenedge.server")
Progress = Callable[[dict[str, Any]], None]
# Progress events after which a job can still stop without changing the pool.
STOPPABLE_PHASES = {"base", "load", "rank", "fold", "anchors", "gate", "compress"}
STOPPABLE_STATUSES = {"resolving", "waiting", "downloading", "present", "verifying"}


@dataclass
class _Job:
    label: str
    work: Callable[[Progress], Any]
    progress: Progress | None
    future: Future = field(default_factory=Future)


class PoolJobs:
    def __init__(self) -> None:
        self._queue: deque[_Job] = deque()
        self._changed = threading.Condition()
        self._current: _Job | None = None
        self.done = 0
        self._closing = threading.Event()     # no new jobs
        self._stopping = threading.Event()    # the running job stops at its next safe point
        self._thread = threading.Thread(target=self._serve, name="zenedge-pool-jobs", daemon=True)
        self._thread.start()

    @property
    def current(self) -> str | None:
        """The label of the job running now (what /api/pool reports)."""
        job = self._current
        return job.label if job else None

    def info(self) -> dict[str, Any]:
        """What GET /api/pool reports of the queue."""
        with self._changed:
            return {"running": self.current, "waiting": len(self._queue), "done": self.done}

    def submit(self, label: str, work: Callable[[Progress], Any], progress: Progress | None = None) -> Future:
        """Queue `work(progress)`; its Future holds the result or the error."""
        job = _Job(label, work, progress)
        with self._changed:
            if self._closing.is_set():
                raise ShuttingDown("the zenedge daemon is shutting down", hint="try again in a moment")
            self._queue.append(job)
            self._tell_waiting()
            self._changed.notify_all()
        return job.future

    async def run(self, label: str, work: Callable[[Progress], Any], progress: Progress | None = None) -> Any:
        """`submit`, awaited."""
        return await asyncio.wrap_future(self.submit(label, work, progress))

    def close(self) -> None:
        """Refuse new jobs and those still waiting; the running one goes on (`stop` ends it)."""
        with self._changed:
            self._closing.set()
            while self._queue:
                self._queue.popleft().future.set_exception(
                    ShuttingDown("the zenedge daemon is shutting down before this job started",
                                 hint="nothing was changed; run it again"))
            self._changed.notify_all()

    def stop(self) -> None:
        """Stop the running job at its next safe point (the grace period is over)."""
        self.close()
        self._stopping.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker to finish; False if it still runs after `timeout` seconds."""
        self.close()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the worker ----------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._closing.is_set():
                    self._changed.wait()
                if not self._queue:
                    return
                job = self._current = self._queue.popleft()
                self._tell_waiting()
            try:
                job.future.set_result(job.work(self._guarded(job)))
            except BaseException as exc:   # the job's error travels to whoever awaits it
                job.future.set_exception(exc)
            finally:
                with self._changed:
                    self._current = None
                    self.done += 1

    def _guarded(self, job: _Job) -> Progress:
        """The job's progress callback, which stops it at a safe point once the daemon is closing."""
        def progress(event: dict[str, Any]) -> None:
            if self._stopping.is_set() and (event.get("phase") in STOPPABLE_PHASES
                                           or event.get("status") in STOPPABLE_STATUSES):
                raise ShuttingDown(f"the zenedge daemon stopped during {job.label}",
                                   hint="nothing was changed; run it again")
            if job.progress is not None:
                job.progress(event)
        return progress

    def _tell_waiting(self) -> None:
        """Each waiting job hears what it waits for (called with the lock held, when the queue moves)."""
        running = self._current.label if self._current else None
        for ahead, job in enumerate(self._queue):
            if job.progress is None or running is None:
                continue
            try:
                job.progress({"status": f"waiting for {running}" + (f" and {ahead} more" if ahead else ""),
                              "phase": "queue", "ahead": ahead + 1})
            except Exception:   # a client that went away: its job still runs when its turn comes
                log.debug("a waiting job's progress callback failed", exc_info=True)
