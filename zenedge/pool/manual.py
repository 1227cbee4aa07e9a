"""`zenedge merge A B --method M`: merge profiles by hand with any method of the merge library,
through the pool's own gate (reported, and enforced unless `--force`) and its own commit
(merger.py), the result serving every member's name."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from zenedge.config import Config
from zenedge.errors import InvalidInput, MergeRejected
from zenedge.pool.phases import Phases, Progress
from zenedge.store import NewAdapter, Store

EDITS_ONE = {"monosoup"}  # methods that rewrite a single adapter; every other needs two or more


def manual_merge(store: Store, cfg: Config, names: list[str], method: str, *, force: bool = False,
                 engine=None, progress: Progress | None = None) -> dict[str, Any]:
    """Merge the adapters serving `names` with `method`; returns members, retention and the time profile."""
    rows = _adapters_to_merge(store, names, method)
    # torch, the merge library and the gate load here, not when the pool package is imported
    from zenedge.adapters.lora_tensors import round_to, stored_format, write_peft_adapter
    from zenedge.adapters.storage import BITS
    from zenedge.merge import merge as run_method
    from zenedge.pool.merger import PoolMerger, is_original, rank_cap

    base = next(iter(rows.values()))["base"]
    phases = Phases(progress)
    merger = PoolMerger.for_base(store, cfg, base, engine, phases)
    adapters = [merger.factors(row) for row in rows.values()]
    with phases.phase("fold", f"merging {', '.join(dict.fromkeys(names))} ({method})"):
        result = run_method(method, adapters, max_rank=rank_cap(cfg, *adapters))
    storage = max((stored_format(store.blob_path(row["sha256"])) for row in rows.values()), key=BITS.__getitem__)
    members = [merger.member(name, merger.variant(adapter_id, factors), is_original(rows[adapter_id]))
               for adapter_id, factors in zip(rows, adapters) for name in store.names_of(adapter_id)]
    threshold = cfg.pool.quality_threshold
    gate = merger.gate.check(members, merger.variant("manual-merge", round_to(result.adapter, storage)), threshold, phases,
                             stop_at_failure=not force)
    retention = {m.name: round(m.retention, 4) for m in gate.measurements}
    if not gate.passed and not force:
        merger.keep_anchors(gate)
        raise MergeRejected(f"{method} merge keeps {retention}, below pool.quality_threshold {threshold}; "
                            "nothing was changed", hint="use --force to keep it anyway")
    member_names = [m.name for m in members]
    with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as work, phases.phase("commit", "storing the merged adapter"):
        config = write_peft_adapter(result.adapter, Path(work), base_model=base, storage_format=storage)
        merged = NewAdapter(kind="merged", base=base, weights=Path(work) / "adapter_model.safetensors",
                            rank=config["r"], target_modules=sorted(result.adapter), config=config,
                            state={"method": method, "members": member_names,
                                   "energy_kept": result.truncation.energy_kept_overall, **_json_safe(result.details)},
                            origin={"source": "merge", "members": member_names, "method": method})
        # Merging only shrinks the pool, so the commit may not be refused for being over B.
        adapter_id = merger.store_merge(merged, member_names, gate.anchors, replaces=list(rows),
                                        budget=max(cfg.budget, store.used_bytes()), max_adapters=None,
                                        newcomer=None, method=method, similarity=None, retention=retention)
    return {"adapter_id": adapter_id, "members": member_names, "method": method, "retention": retention,
            "examples": {m.name: m.examples for m in gate.measurements if m.metric == "loss"},
            "energy_kept": result.truncation.energy_kept_overall, "bytes": store.adapter(adapter_id)["bytes"],
            "profile": phases.profile()}


def _adapters_to_merge(store: Store, names: list[str], method: str) -> dict[str, dict[str, Any]]:
    """The distinct adapters serving `names` (id → row), refused before anything slow when the
    method cannot merge them."""
    from zenedge.pool.merger import MERGEABLE

    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        row = store.resolve(name)
        rows.setdefault(row["id"], row)
    if method in EDITS_ONE and len(rows) != 1:
        raise InvalidInput(f"{method} edits one adapter; {', '.join(map(repr, names))} are served by {len(rows)}")
    if method not in EDITS_ONE and len(rows) < 2:
        served = ", ".join(repr(n) for n in dict.fromkeys(names))
        raise InvalidInput(f"a merge needs at least two different adapters; {served} "
                           f"{'is' if len(set(names)) == 1 else 'are'} served by one adapter",
                           hint="name profiles served by different adapters (see `zenedge list`)")
    for row in rows.values():
        if row["kind"] not in MERGEABLE:
            raise InvalidInput(f"{row['kind']} adapters cannot be merged by hand (only LoRA and merged ones)")
    if len({row["base"] for row in rows.values()}) != 1:
        raise InvalidInput("the adapters belong to different bases")
    return rows


def _json_safe(details: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in details.items() if isinstance(v, (int, float, str, bool, list))}
