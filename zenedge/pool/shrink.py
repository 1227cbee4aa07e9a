"""Compress before merging: under budget pressure, re-store the least requested adapters in a
smaller format (bf16 → int8 → int4, adapters/storage.py) before anything is merged or evicted.

A re-store is kept only if every profile the adapter serves keeps `pool.compress_threshold` of
its gain: the merge gate's rule (gate.py), on the profile's own eval set against the anchors of
the adapter it arrived as (the data-free proxy where it has no eval set). Steps go round by
round, least requested adapter first and the newcomer last, so every adapter reaches int8 before
any reaches int4; they stop as soon as enough bytes are free. Each kept step is one transaction
(the store's put_adapter replacing the old form; its names, request statistics and pin move to
the new one): a kill at any point leaves the old form or the new one, never neither.

Admission, `budget set` and maintenance call `shrink` first and merge or evict only what it could
not free; it does nothing when even every step could not free enough (then a merge is needed
anyway, and the gate passes would be wasted).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from zenedge.config import Config
from zenedge.pool.phases import Phases
from zenedge.pool.results import ShrinkStep
from zenedge.sizes import format_size
from zenedge.store import NewAdapter, NewName, Store

SHRINKABLE = ("lora", "merged")


@dataclass
class Newcomer:
    """The adapter being admitted, which may be stored smaller too (after every stored one):
    `adapter` and `entry` are updated in place when a step is kept."""

    adapter: NewAdapter
    entry: NewName
    workdir: Path     # where its smaller file lives until the caller commits it


@dataclass
class _Item:
    label: str
    names: list[str]
    base: str
    storage: str
    bytes: int
    row: dict[str, Any] | None = None        # a stored adapter; None for the newcomer
    factors: dict | None = None
    refused: bool = False
    sizes: dict[str, int] = field(default_factory=dict)   # format → its exact file size in that format


def shrink(store: Store, cfg: Config, need: int, phases: Phases, *, engine=None,
           newcomer: Newcomer | None = None) -> list[ShrinkStep]:
    """Re-store adapters smaller until `need` bytes are freed, or no step is left. Returns what was
    tried, in order."""
    lowest = cfg.pool.compress_to
    if lowest == "off" or need <= 0:
        return []
    from zenedge.adapters.storage import smaller_than

    items = _items(store, cfg, newcomer)
    ladder = smaller_than("fp32", lowest)
    potential = sum(item.bytes - _size(item, store, lowest, newcomer) for item in items
                    if smaller_than(item.storage, lowest))
    if potential < need:
        if potential > 0:
            phases.note(f"storing adapters smaller would free at most {format_size(potential)} of the "
                        f"{format_size(need)} needed; merging instead", "compress")
        return []
    tried: list[ShrinkStep] = []
    freed = 0
    mergers: dict[str, Any] = {}
    for storage in ladder:
        for item in items:
            if freed >= need:
                return tried
            if item.refused or storage not in smaller_than(item.storage, lowest):
                continue
            if item.base not in mergers:
                from zenedge.pool.merger import PoolMerger

                mergers[item.base] = PoolMerger.for_base(store, cfg, item.base, engine, phases)
            step = _step(store, cfg, mergers[item.base], item, storage, newcomer)
            tried.append(step)
            freed += step.freed_bytes if step.kept else 0
    return tried


def _items(store: Store, cfg: Config, newcomer: Newcomer | None) -> list[_Item]:
    """What may be stored smaller, least requested first (the store's eviction order, never
    pinned), then the newcomer."""
    from zenedge.adapters.lora_tensors import stored_format

    items = []
    for row in store.eviction_order(pinned_names=cfg.runtime.pinned):
        if row["kind"] in SHRINKABLE:
            names = store.names_of(row["id"])
            items.append(_Item("+".join(names) or row["id"][:12], names, row["base"],
                               stored_format(store.blob_path(row["sha256"])), row["bytes"], row=row))
    if newcomer is not None and newcomer.adapter.kind == "lora":
        adapter = newcomer.adapter
        items.append(_Item(newcomer.entry.name, [newcomer.entry.name], adapter.base,
                           stored_format(adapter.weights), adapter.weights.stat().st_size))
    return items


def _factors(item: _Item, store: Store, newcomer: Newcomer | None) -> dict:
    if item.factors is None:
        import torch

        from zenedge.adapters.lora_tensors import read_lora_factors

        if item.row is not None:
            path, config = store.verified_blob(item.row["sha256"]), item.row["config"]
        else:
            path, config = newcomer.adapter.weights, newcomer.adapter.config
        item.factors = read_lora_factors(path, config, dtype=torch.float32)
    return item.factors


def _size(item: _Item, store: Store, storage: str, newcomer: Newcomer | None = None) -> int:
    """The exact file size of `item` in `storage` (the header included)."""
    if storage not in item.sizes:
        from zenedge.adapters.lora_tensors import peft_tensors
        from zenedge.adapters.storage import encoded_file

        factors = _factors(item, store, newcomer)
        item.sizes[storage] = len(encoded_file(peft_tensors(factors, rank=max(f.rank for f in factors.values())),
                                               storage))
    return item.sizes[storage]


def _step(store: Store, cfg: Config, merger, item: _Item, storage: str, newcomer: Newcomer | None) -> ShrinkStep:
    """Write `item` in `storage`, gate it on every profile it serves, and keep it if they all pass."""
    from zenedge.adapters.lora_tensors import read_lora_factors, write_peft_adapter
    from zenedge.pool.gate import Member
    from zenedge.pool.merger import is_original, member_entry

    phases = merger.phases
    factors = _factors(item, store, newcomer)
    work = Path(tempfile.mkdtemp(dir=newcomer.workdir if item.row is None else store.blobs.tmp))
    try:
        with phases.phase("compress", f"writing {item.label} as {storage} (from {item.storage})",
                          names=item.names, storage=storage):
            config = write_peft_adapter(factors, work, base_model=item.base, storage_format=storage)
            weights = work / "adapter_model.safetensors"
            smaller = read_lora_factors(weights, config)
        size = weights.stat().st_size
        current = merger.variant(item.row["id"] if item.row else f"incoming-{item.label}", factors)
        if item.row is not None:
            members = [merger.member(name, current, is_original(item.row)) for name in item.names]
        else:
            entry = newcomer.entry
            members = [Member(entry.name, entry.eval_path, dict(entry.quality), current, True)]
        result = merger.gate.check(members, merger.variant(f"compressed-{storage}", smaller),
                                   cfg.pool.compress_threshold, phases)
        retention = {m.name: round(m.retention, 4) for m in result.measurements}
        kept = result.passed
        step = ShrinkStep(item.names, item.storage, storage, retention, freed_bytes=item.bytes - size, kept=kept)
        least = min(retention.values(), default=0.0)
        if not kept:
            item.refused = True
            merger.keep_anchors(result, exclude=newcomer.entry.name if newcomer else None)
            if newcomer is not None and newcomer.entry.name in result.anchors:
                newcomer.entry.quality = result.anchors[newcomer.entry.name]
            phases.note(f"keeping {item.label} as {item.storage}: {storage} keeps {least:.3f} of its gain "
                        f"(pool.compress_threshold {cfg.pool.compress_threshold:g})", "compress", **step.as_dict())
            return step
        phases.note(f"compressing {item.label}: {storage}, keeps {least:.3f} of its gain, frees "
                    f"{format_size(item.bytes - size)}", "compress", **step.as_dict())
        state = {**((item.row or {}).get("state") or {}),
                 "compressed": {"from": item.storage, "to": storage, "retention": retention}}
        if item.row is None:
            newcomer.adapter = replace(newcomer.adapter, weights=weights, rank=config["r"], config=config, state=state)
            newcomer.entry.quality = result.anchors.get(newcomer.entry.name, newcomer.entry.quality)
        else:
            _commit(store, cfg, item, weights, config, state, result.anchors, member_entry, phases)
        item.storage, item.bytes, item.factors = storage, size, smaller
        return step
    finally:
        if item.row is not None:   # a stored adapter's file is in the store now, or not kept
            shutil.rmtree(work, ignore_errors=True)


def _commit(store: Store, cfg: Config, item: _Item, weights: Path, config: dict, state: dict,
            anchors: dict, member_entry, phases: Phases) -> None:
    row = item.row
    smaller = NewAdapter(kind=row["kind"], base=row["base"], weights=weights, rank=config["r"],
                         target_modules=sorted(row["target_modules"]), config=config, state=state,
                         origin=row.get("origin") or {})
    names = [member_entry(store, name, anchors.get(name)) for name in item.names]
    with phases.phase("commit", f"storing {item.label} as {state['compressed']['to']}"):
        # Storing smaller only frees bytes: the commit may not be refused for the pool being over B.
        new_id = store.put_adapter(smaller, names, budget=max(cfg.budget, store.used_bytes()), replaces=[row["id"]],
                                   event="compress", inherits=row["id"])
    item.row = store.adapter(new_id)
