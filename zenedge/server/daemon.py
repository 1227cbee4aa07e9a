"""The daemon's life: claim the home, bind, serve, reload on SIGHUP, drain on SIGTERM/SIGINT.

Shutdown order: stop accepting (listeners close, new jobs get 503), let in-flight requests finish
within the grace period, cancel what is left, stop the scheduler, remove the socket and
daemon.json, exit 0. A second SIGTERM/SIGINT skips the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Callable

import uvicorn

from zenedge import __version__
from zenedge.api import discovery
from zenedge.config import Config
from zenedge.runtime.engine import Engine
from zenedge.server import instance, listeners
from zenedge.server.app import create_app
from zenedge.server.background import Background
from zenedge.server.idle import exit_when_idle
from zenedge.server.pool_jobs import PoolJobs
from zenedge.server.scheduler import Scheduler
from zenedge.server.settings import Settings
from zenedge.server.state import DaemonState
from zenedge.store import Store

log = logging.getLogger("zenedge.server")
CANCEL_MARGIN = 5.0  # seconds after the grace period for cancelled streams to send their last event


class _Server(uvicorn.Server):
    """uvicorn, minus its signal handling: it would re-raise SIGTERM after shutdown (exit status
    -15 instead of 0), and the daemon needs SIGHUP for itself."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Daemon:
    def __init__(self, settings: Settings, cfg: Config, announce: Callable[[str], None] = _stderr):
        self.settings = settings
        self.cfg = cfg
        self.announce = announce
        self.started = threading.Event()   # set once the listeners accept connections
        self.state: DaemonState | None = None
        self.tcp_port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: _Server | None = None

    def run(self, claim: instance.Claim | None = None) -> int:
        """Serve until told to stop; raises AlreadyRunning when the home already has a daemon.
        `claim`: the home, already claimed by the caller (released here at the end)."""
        claim = claim or instance.claim(self.settings.home, self.settings.socket)
        try:
            for note in claim.notes:
                self.announce(f"note: {note}")
            asyncio.run(self._serve())
            return 0
        finally:
            claim.release()

    def request_exit(self) -> None:
        """Thread-safe: begin a graceful shutdown (what SIGTERM does)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._begin_exit)

    def _begin_exit(self) -> None:
        if self._server is None:
            return
        if self._server.should_exit:
            self._server.force_exit = True  # asked twice: skip the grace period
            return
        self._server.should_exit = True
        if self.state is not None:
            scheduler = self.state.scheduler
            scheduler.stop_accepting()
            running = scheduler.stats()
            log.info("shutting down: %d running, %d queued; grace %.0fs", running["running"], running["queued"],
                     self.settings.grace_seconds)
            # At the end of the grace period, cancel what is left ourselves: streams then end with
            # finish_reason "cancelled" and [DONE] instead of a cut connection (uvicorn's own
            # deadline, a little later, is only the backstop).
            self._loop.call_later(self.settings.grace_seconds, scheduler.cancel_all)
            self.state.jobs.close()                           # queued pool jobs are refused now,
            self._loop.call_later(self.settings.grace_seconds, self.state.jobs.stop)  # the running one after the grace

    async def _serve(self) -> None:
        settings = self.settings
        store = Store(settings.home)
        engine = Engine(store, self.cfg, progress=lambda message: log.info("base: %s", message))
        scheduler = Scheduler(engine, max_queue=self.cfg.server.max_queue, max_batch=settings.max_batch)
        jobs = PoolJobs()
        self.state = state = DaemonState(settings, self.cfg, store, engine, scheduler, jobs, stop=self._begin_exit)
        background = Background(state)
        app = create_app(state, background)
        unix = listeners.bind_unix(settings.socket, private_dir=settings.socket_is_default)
        sockets = [unix.sock]
        try:
            if settings.tcp:
                tcp = listeners.bind_tcp(*settings.tcp)
                self.tcp_port = tcp.getsockname()[1]
                sockets.append(tcp)
        except BaseException:
            unix.sock.close()
            unix.remove()
            raise
        self._loop = asyncio.get_running_loop()
        self._server = server = _Server(uvicorn.Config(
            app, lifespan="off", log_config=None, access_log=False, server_header=False,
            timeout_graceful_shutdown=settings.grace_seconds + CANCEL_MARGIN))
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._begin_exit)
            self._loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(background.reload()))
        scheduler.start()
        upkeep = asyncio.create_task(background.run())
        watcher = asyncio.create_task(self._announce_when_started(server, unix.path))
        idle = None
        if settings.idle_exit_seconds > 0:
            idle = asyncio.create_task(exit_when_idle(state.activity, settings.idle_exit_seconds,
                                                      lambda: background.running or jobs.current is not None,
                                                      self._begin_exit))
        try:
            await server.serve(sockets=sockets)
        finally:
            for task in (upkeep, watcher, idle):
                if task is not None:
                    task.cancel()
            await asyncio.to_thread(scheduler.stop, settings.grace_seconds)
            jobs.stop()
            await asyncio.to_thread(jobs.join)                 # a commit under way finishes; then no pool work is left
            unix.remove()
            self._remove_info()
            log.info("stopped")

    async def _announce_when_started(self, server: _Server, socket_path) -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        settings = self.settings
        tcp = f"{settings.tcp[0]}:{self.tcp_port}" if settings.tcp else None
        self._write_info(str(socket_path), tcp)
        self.announce(f"zenedge {__version__} daemon (pid {os.getpid()}) serving {settings.home}")
        self.announce(f"  unix socket  {socket_path}")
        if tcp:
            auth = f"bearer token: {settings.token_source}"
            if self.state.cfg.server.tcp_auth == "loopback":
                auth = f"no token from loopback (server.tcp_auth); from elsewhere the {auth}"
            self.announce(f"  tcp          http://{tcp}  ({auth})")
        for note in settings.notes:
            self.announce(f"note: {note}")
        self.started.set()

    def _write_info(self, socket_path: str, tcp: str | None) -> None:
        info = {"pid": os.getpid(), "version": __version__, "socket": socket_path, "tcp": tcp,
                "home_id": discovery.home_id(self.settings.home), "started_at": time.time()}
        path = discovery.info_path(self.settings.home)
        tmp = path.with_name(f".daemon-{os.getpid()}.json")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(info, handle)
        os.replace(tmp, path)

    def _remove_info(self) -> None:
        path = discovery.info_path(self.settings.home)
        info = discovery.read_info(self.settings.home)
        if info and info.get("pid") == os.getpid():
            path.unlink(missing_ok=True)
