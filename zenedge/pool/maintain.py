"""`zenedge pool maintain`: what the daemon's background loop runs, and what a user runs after
editing the config by hand.

1. Reconcile: remove crash leftovers (tmp files, orphan blobs).
2. Verify: re-hash every blob; an adapter whose blob is missing or corrupt cannot be served, so it
   is removed (its names are reported: `zenedge pull NAME` brings them back).
3. Enforce the budget and slot limit after a config change: first store adapters smaller
   (shrink.py, each quality-checked) if that frees enough bytes; then merge before evicting: the least
   requested single-profile LoRA is merged into its most similar stored adapter when the quality
   gate passes; what still does not fit is evicted by request-rate-weighted LRU (never pinned).
"""

from __future__ import annotations

from typing import Any

from zenedge.config import Config
from zenedge.pool.budget import enforce_budget
from zenedge.pool.phases import Phases
from zenedge.pool.shrink import shrink
from zenedge.store import Store


def maintain(store: Store, cfg: Config, engine=None, *, verify: bool = True) -> dict[str, Any]:
    report: dict[str, Any] = {"reconciled": store.reconcile(blocking=True), "removed_corrupt": [],
                              "compressed": [], "merged": [], "evicted": []}
    with store.writing():
        if verify:
            report["removed_corrupt"] = _remove_corrupt(store)
        over = store.used_bytes() - cfg.budget
        steps = shrink(store, cfg, over, Phases(), engine=engine) if over > 0 else []
        report["compressed"] = [step.as_dict() for step in steps]
        report["merged"] = _merge_until_it_fits(store, cfg, engine)
        plan = enforce_budget(store, cfg)
        report["evicted"] = plan.names
        over_slots = store.usage().adapters - cfg.pool.max_adapters
        if over_slots > 0:
            victims = [a["id"] for a in store.eviction_order(pinned_names=cfg.runtime.pinned)[:over_slots]]
            report["evicted"] += store.evict(victims, reason="over pool.max_adapters")
    report["problems"] = store.check(budget=cfg.budget)
    return report


def _remove_corrupt(store: Store) -> list[str]:
    broken = [a["id"] for a in store.adapters()
              if not store.blobs.has(a["sha256"]) or not store.blobs.verify(a["sha256"])]
    return store.evict(broken, reason="blob missing or corrupt") if broken else []


def _over(store: Store, cfg: Config) -> bool:
    return store.used_bytes() > cfg.budget or store.usage().adapters > cfg.pool.max_adapters


def _merge_until_it_fits(store: Store, cfg: Config, engine) -> list[dict[str, Any]]:
    """Merge the least requested single-profile LoRAs into their most similar stored adapters
    (merger.py's loop, replacing both) while the pool is over B or its slots."""
    from zenedge.pool.merger import Incoming, PoolMerger  # torch loads here, only when over

    merges: list[dict[str, Any]] = []
    tried: set[str] = set()
    while _over(store, cfg):
        order = [a for a in store.eviction_order(pinned_names=cfg.runtime.pinned)
                 if a["kind"] == "lora" and a["id"] not in tried and len(store.names_of(a["id"])) == 1]
        if not order:
            break
        source = order[0]
        tried.add(source["id"])
        [name] = store.names_of(source["id"])
        merger = PoolMerger.for_base(store, cfg, source["base"], engine)
        row = store.name(name)
        incoming = Incoming(name, merger.factors(source), merger.eval_path(row), dict(row.get("quality") or {}),
                            key=source["id"])
        candidates = [(c, sim) for c, sim in merger.candidates(incoming, source["base"]) if c["id"] != source["id"]]
        # Merging only shrinks the pool, so the commit may not be refused for being over B.
        merged = merger.merge_first_kept(incoming, source["base"], candidates, attempts=[],
                                         budget=max(cfg.budget, store.used_bytes()),
                                         also_replaces=(source["id"],), source="maintain")
        if merged is not None:
            merges.append(merged[1].summary().as_dict())
    return merges
