"""The delta cache: variants held in device memory (host memory on CPU) under a byte budget.

Eviction is request-rate-weighted LRU: each entry's rate is an exponentially decayed request
count; the lowest rate goes first (least recent breaks ties). Pinned variants (the keys `pinned()`
returns: the engine asks the store, the one place that knows) and the top-N by rate are never
evicted. Loads are single-flight: N concurrent requests for an uncached variant cause
exactly one load; the others wait for it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Collection

from zenedge.runtime.variants import Variant

HALF_LIFE = 300.0  # seconds: the cache reacts to the last few minutes of traffic


@dataclass
class Entry:
    variant: Variant
    load_seconds: float
    loaded_at: float
    last_used: float
    rate: float = 0.0
    rate_at: float = 0.0
    requests: int = 0
    names: set[str] = field(default_factory=set)

    def rate_now(self, now: float) -> float:
        return self.rate * 0.5 ** ((now - self.rate_at) / HALF_LIFE)


class DeltaCache:
    def __init__(self, budget_bytes: int, pinned: Callable[[], Collection[str]] = frozenset, keep_top: int = 1,
                 clock: Callable[[], float] = time.monotonic):
        self.budget = budget_bytes
        self.pinned = pinned    # asked only when something must go: pins can change while serving
        self.keep_top = keep_top
        self.clock = clock
        self._entries: dict[str, Entry] = {}
        self._loading: dict[str, Future] = {}
        self._lock = threading.Lock()
        self.loads = 0          # completed loads (what single-flight tests count)
        self.evictions = 0

    def get(self, key: str, load: Callable[[], Variant], name: str | None = None) -> Variant:
        """The cached variant for `key`, loading it once if needed (concurrent callers share the load)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._touch(entry, name)
                return entry.variant
            future = self._loading.get(key)
            owner = future is None
            if owner:
                future = self._loading[key] = Future()
        if not owner:
            variant = future.result()  # re-raises the loader's error for every waiter
            with self._lock:
                if key in self._entries:
                    self._touch(self._entries[key], name)
            return variant
        try:
            start = time.perf_counter()
            variant = load()
            seconds = time.perf_counter() - start
        except BaseException as exc:
            with self._lock:
                del self._loading[key]
            future.set_exception(exc)
            raise
        with self._lock:
            now = self.clock()
            entry = Entry(variant, seconds, now, now, rate_at=now)
            self._entries[key] = entry
            self._touch(entry, name)
            del self._loading[key]
            self.loads += 1
            self._evict(protect=key)
        future.set_result(variant)
        return variant

    def _touch(self, entry: Entry, name: str | None) -> None:
        now = self.clock()
        entry.rate = entry.rate_now(now) + 1.0
        entry.rate_at = now
        entry.last_used = now
        entry.requests += 1
        if name:
            entry.names.add(name)

    def _evict(self, protect: str) -> None:
        now = self.clock()
        used = sum(e.variant.nbytes for e in self._entries.values())
        if used <= self.budget:
            return
        by_rate = sorted(self._entries, key=lambda k: self._entries[k].rate_now(now), reverse=True)
        keep = {protect} | set(by_rate[: self.keep_top])
        keep |= set(self.pinned()) & set(self._entries)
        order = sorted((k for k in self._entries if k not in keep),
                       key=lambda k: (self._entries[k].rate_now(now), self._entries[k].last_used))
        for key in order:
            if used <= self.budget:
                break
            used -= self._entries.pop(key).variant.nbytes
            self.evictions += 1

    def drop(self, key: str) -> None:
        """Forget a variant (its adapter was removed or merged away)."""
        with self._lock:
            self._entries.pop(key, None)

    def set_budget(self, budget_bytes: int) -> None:
        with self._lock:
            self.budget = budget_bytes
            self._evict(protect="")

    def snapshot(self) -> list[dict]:
        now = self.clock()
        with self._lock:
            return [{"key": k, "kind": e.variant.kind, "bytes": e.variant.nbytes, "names": sorted(e.names),
                     "load_seconds": e.load_seconds, "requests": e.requests, "rate": e.rate_now(now),
                     "idle_seconds": now - e.last_used} for k, e in self._entries.items()]

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(e.variant.nbytes for e in self._entries.values())

    def __contains__(self, key: str) -> bool:
        return key in self._entries
