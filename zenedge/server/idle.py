"""Idle exit: a daemon the CLI started on its own (`server.keep_alive`) leaves once nothing has asked
it anything for that long, so a `zenedge pull` on a laptop does not leave a process behind for good.

Activity is counted where every request passes: an ASGI middleware around the whole app (a
streamed response counts until its last byte). Background maintenance counts too: a daemon in the
middle of a merge is not idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

log = logging.getLogger("zenedge.server")


class Activity:
    """Requests in flight and when the last one ended (touched on the event loop only: no lock)."""

    def __init__(self) -> None:
        self.inflight = 0
        self.last = time.monotonic()

    def touch(self) -> None:
        self.last = time.monotonic()

    def idle_seconds(self) -> float:
        return 0.0 if self.inflight else time.monotonic() - self.last


class CountRequests:
    """ASGI middleware: every HTTP request is activity from its first to its last byte."""

    def __init__(self, app, activity: Activity):
        self.app = app
        self.activity = activity

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.activity.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.activity.inflight -= 1
            self.activity.touch()


async def exit_when_idle(activity: Activity, seconds: float, busy: Callable[[], bool],
                         begin_exit: Callable[[], None]) -> None:
    """Call `begin_exit` (a graceful shutdown) once `activity` has been idle for `seconds` while
    `busy()` said no (background work resets the clock)."""
    tick = min(max(seconds / 4, 0.05), 5.0)
    while True:
        await asyncio.sleep(tick)
        if busy():
            activity.touch()
        elif activity.idle_seconds() >= seconds:
            log.info("no request for %.0f s: exiting (server.keep_alive)", seconds)
            begin_exit()
            return
