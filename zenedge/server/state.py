"""What the routes share: the pool, the engine, the scheduler, and the config in force.

Methods here are blocking (SQLite, the writer lock, torch); routes call them through a thread.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from zenedge import __version__
from zenedge.api import discovery
from zenedge.config import Config
from zenedge.errors import AdapterNotFound, BudgetExceeded, InvalidName
from zenedge.pool.budget import enforce_budget
from zenedge.runtime.engine import Engine
from zenedge.runtime.router import Route
from zenedge.server.idle import Activity
from zenedge.server.pool_jobs import PoolJobs
from zenedge.server.scheduler import Scheduler
from zenedge.server.settings import Settings
from zenedge.store import Store

log = logging.getLogger("zenedge.server")


@dataclass
class DaemonState:
    settings: Settings
    cfg: Config
    store: Store
    engine: Engine
    scheduler: Scheduler
    jobs: PoolJobs                                         # pool changes, one at a time (pool_jobs.py)
    started_at: float = field(default_factory=time.monotonic)
    activity: Activity = field(default_factory=Activity)   # requests in flight, for the idle exit
    stop: Callable[[], None] = lambda: None                # begin a graceful shutdown (POST /api/stop)

    @property
    def uptime(self) -> float:
        return time.monotonic() - self.started_at

    def health(self) -> dict:
        return {"status": "ok", "version": __version__, "pid": os.getpid(), "uptime_seconds": self.uptime,
                "home_id": discovery.home_id(self.settings.home), "on_demand": self.settings.idle_exit_seconds > 0}

    def route(self, model: str) -> Route:
        """A request's `model` → route; any name that is not a base or a pulled profile is a 404."""
        try:
            return self.engine.router.route(model)
        except InvalidName:
            raise AdapterNotFound(f"model {model[:80]!r} does not exist", hint="see GET /v1/models") from None

    def sync_cache(self) -> None:
        """Forget cached variants whose adapters left the pool (removed, evicted, merged away)."""
        present = {a["id"] for a in self.store.adapters()}
        for entry in self.engine.cache.snapshot():
            if entry["key"] not in present:
                self.engine.cache.drop(entry["key"])

    def apply_config(self, cfg: Config) -> list[str]:
        """Put a re-read config in force without a restart; return what changed."""
        old, self.cfg = self.cfg, cfg
        self.engine.use_config(cfg)
        changed = cfg.changes(old)
        self.engine.cache.set_budget(cfg.runtime.cache_budget)  # pins: the engine reads them from cfg
        self.scheduler.max_queue = cfg.server.max_queue
        if {"pool.budget", "runtime.pinned"} & set(changed):
            try:
                plan = enforce_budget(self.store, cfg)
                if plan.evict:
                    log.info("budget now %d bytes: evicted %s", cfg.budget, ", ".join(plan.names))
            except BudgetExceeded as exc:
                log.warning("config reload: %s", exc)
            self.sync_cache()
        restart_only = [c for c in changed if c.startswith("server.") and c not in ("server.max_queue",
                                                                                      "server.cors_origins")]
        if restart_only:
            log.warning("%s change(s) take effect after a restart", ", ".join(restart_only))
        return changed
