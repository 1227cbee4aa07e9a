"""The storage budget B: plan which adapters a lower budget evicts, set it, enforce it.

Setting B below what the pool uses stores adapters smaller first (shrink.py, quality-checked);
only what that cannot free is evicted.

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
from zenedge.pool.phases import Phases, Progress
from zenedge.pool.results import ShrinkStep
from zenedge.pool.shrink import shrink
from zenedge.sizes import format_size
from zenedge.store import Store


@dataclass
class EvictionPlan:
    budget: int
    used_before: int
    evict: list[dict[str, Any]] = field(default_factory=list)   # adapter rows, in order
    used_after: int = 0
    compressed: list[ShrinkStep] = field(default_factory=list)   # shrink.py's steps, before the plan

    @property
    def names(self) -> list[str]:
        return [n for a in self.evict for n in a["names"]]

    def as_dict(self, dry_run: bool) -> dict[str, Any]:
        """The plan as `budget set --json` and the daemon's PUT /api/budget report it."""
        return {"budget_bytes": self.budget, "used_before": self.used_before, "used_after": self.used_after,
                "evict": self.names, "dry_run": dry_run,
                "compressed": [step.as_dict() for step in self.compressed],
                "evicted": [{"names": a["names"], "kind": a["kind"], "freed_bytes": a["freed"]} for a in self.evict]}


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


def set_budget(store: Store, cfg: Config, size: str, *, dry_run: bool = False, engine=None,
               progress: Progress | None = None) -> EvictionPlan:
    """Lower or raise B: below what the pool uses, store adapters smaller first (shrink.py), then
    evict what that could not free (so a crash leaves a smaller, consistent pool), then write the
    file. A dry run plans the evictions as if nothing could be stored smaller."""
    budget = config_mod.parse_budget(size)  # refused here, before anything is evicted
    with store.writing():
        plan_budget(store, cfg, budget)   # pinned adapters alone over it: refused before anything changes
        compressed = []
        if not dry_run and store.used_bytes() > budget:
            compressed = shrink(store, cfg, store.used_bytes() - budget, Phases(progress), engine=engine)
        plan = plan_budget(store, cfg, budget)
        plan.compressed = compressed
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
