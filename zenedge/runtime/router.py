"""Routing: a name users type → the base it runs on and the stored adapter that serves it.

A profile that is not in the pool is an error naming `zenedge pull NAME`, never a silent fall-back
to the base. A merged adapter serves every member's name. In-flight counts per adapter let the
daemon report load and keep busy variants cached.
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from zenedge.bases import find_base
from zenedge.store import Store


@dataclass(frozen=True)
class Route:
    name: str
    base: str
    adapter: dict[str, Any] | None  # None: the plain base

    @property
    def key(self) -> str | None:
        return self.adapter["id"] if self.adapter else None


class Router:
    def __init__(self, store: Store):
        self.store = store
        self._inflight: Counter[str] = Counter()
        self._lock = threading.Lock()

    def route(self, name: str) -> Route:
        base = self.store.base(name) or find_base(self.store, name)
        if base is not None:
            return Route(name, base["name"], None)
        if name == "smollm2-135m":  # the default base before its first conversion
            return Route(name, name, None)
        adapter = self.store.resolve(name)  # raises AdapterNotFound with the pull hint
        return Route(name, adapter["base"], adapter)

    @contextmanager
    def inflight(self, route: Route) -> Iterator[None]:
        key = route.key or f"base:{route.base}"
        with self._lock:
            self._inflight[key] += 1
        try:
            yield
        finally:
            with self._lock:
                self._inflight[key] -= 1
                if not self._inflight[key]:
                    del self._inflight[key]

    def inflight_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._inflight)
