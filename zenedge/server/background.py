"""The daemon's background loop: re-read the config when it changes (or on SIGHUP), run pool
maintenance every `pool.maintain_interval` seconds.

The config file is polled (mtime, size, inode): cheap, portable, and it sees editors that replace
the file. A broken edit is logged and ignored; the config in force stays in force.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from zenedge import config as config_mod
from zenedge.errors import Conflict, ZenedgeError
from zenedge.server.state import DaemonState

log = logging.getLogger("zenedge.server")


def _signature(path: Path) -> tuple | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_mtime_ns, info.st_size, info.st_ino


class Background:
    def __init__(self, state: DaemonState):
        self.state = state
        self.path = state.settings.config_path
        self.seen = _signature(self.path)
        self.reloads = 0
        self.running = False
        self.last_run_at: float | None = None
        self.last_result: dict[str, Any] | None = None
        self.last_error: str | None = None
        self._reload_lock = asyncio.Lock()

    def info(self) -> dict[str, Any]:
        return {"available": True,   # the wire keeps the field: maintenance ships with every build
                "interval_seconds": self.state.cfg.pool.maintain_interval,
                "running": self.running, "last_run_at": self.last_run_at, "last_result": self.last_result,
                "last_error": self.last_error, "config_reloads": self.reloads}

    async def run(self) -> None:
        """The background loop (cancelled at shutdown)."""
        next_run = time.monotonic() + self.state.cfg.pool.maintain_interval
        poll = self.state.settings.config_poll_seconds  # 0: no watching, SIGHUP only
        while True:
            await asyncio.sleep(poll if poll > 0 else 1.0)
            if poll > 0 and _signature(self.path) != self.seen:
                await self.reload()
            interval = self.state.cfg.pool.maintain_interval
            if interval > 0 and time.monotonic() >= next_run and not self.running:
                next_run = time.monotonic() + interval
                try:
                    await self.maintain()
                except Exception as exc:
                    log.warning("background maintenance failed: %s", exc)
            elif interval <= 0:
                next_run = time.monotonic()

    async def reload(self) -> list[str]:
        """Re-read the config file and put it in force (SIGHUP, file change, budget set)."""
        async with self._reload_lock:
            self.seen = _signature(self.path)
            try:
                cfg = await asyncio.to_thread(config_mod.load, self.path)
            except ZenedgeError as exc:
                log.warning("config not reloaded, keeping the one in force: %s", exc)
                return []
            changed = await asyncio.to_thread(self.state.apply_config, cfg)
            self.reloads += 1
            if changed:
                log.info("config reloaded: %s", ", ".join(changed))
            return changed

    async def maintain(self) -> dict[str, Any]:
        from zenedge.pool.maintain import maintain
        if self.running:
            raise Conflict("pool maintenance is already running")
        self.running = True
        try:
            result = await self.state.jobs.run("pool maintenance",
                                               lambda progress: maintain(self.state.store, self.state.cfg, self.state.engine))
            self.last_result, self.last_error = dict(result or {}), None
            return self.last_result
        except Exception as exc:
            self.last_error = str(exc)
            raise
        finally:
            self.running = False
            self.last_run_at = time.time()
            await asyncio.to_thread(self.state.sync_cache)
