"""The storage budget B: plan which adapters a lower budget evicts, set it, enforce it.

Evictions follow the store's order (request-rate-weighted LRU, never pinned) and are planned
before anything is removed: a budget that pinned adapters alone exceed is refused with nothing
changed. Setting B evicts first, then writes the config file, so a crash in between leaves a
smaller, consistent pool under the old, larger budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zenedge import config as config_mod
from zenedge.config import Config
from zenedge.errors import BudgetExceeded
from zenedge.sizes import format_size
from zenedge.store import Store


@dataclass
class EvictionPlan:
    budget: int
    used_before: int
    evict: list[dict[str, Any]] = field(default_factory=list)   # adapter rows, in order
    used_after: int = 0

    @property
    def names(self) -> list[str]:
        return [n for a in self.evict for n in a["names"]]


def plan_budget(store: Store, cfg: Config, budget: int) -> EvictionPlan:
    """Which adapters `budget set` would evict (rate-weighted LRU, never pinned)."""
    used = store.used_bytes()
    plan = EvictionPlan(budget=budget, used_before=used, used_after=used)
    for adapter in store.eviction_order(pinned_names=cfg.runtime.pinned):
        if plan.used_after <= budget:
            break
        freed = store.freed_by_evicting(adapter["id"])
        plan.evict.append({**adapter, "names": store.names_of(adapter["id"]), "freed": freed})
        plan.used_after -= freed
    if plan.used_after > budget:
        raise BudgetExceeded(
            f"pinned adapters alone use {format_size(plan.used_after)}, more than {format_size(budget)}; "
            "nothing was changed",
            hint="unpin some with `zenedge unpin NAME` or choose a larger budget",
        )
    return plan


def set_budget(store: Store, cfg: Config, size: str, *, dry_run: bool = False) -> EvictionPlan:
    """Lower or raise B: evict first (so a crash leaves a smaller, consistent pool), then write the file."""
    budget = config_mod.parse_budget(size)  # refused here, before anything is evicted
    with store.writing():
        plan = plan_budget(store, cfg, budget)
        if dry_run:
            return plan
        if plan.evict:
            store.evict([a["id"] for a in plan.evict], reason=f"budget set to {format_size(budget)}")
        config_mod.set_value("pool", "budget", size, cfg.path)
        store.record_budget(budget, evicted=plan.names)
    return plan


def enforce_budget(store: Store, cfg: Config) -> EvictionPlan:
    """Bring the pool back under the configured budget (after a config edit); used by maintenance."""
    with store.writing():
        plan = plan_budget(store, cfg, cfg.budget)
        if plan.evict:
            store.evict([a["id"] for a in plan.evict], reason="over the configured budget")
        return plan
