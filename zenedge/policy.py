"""Pool policy: the one orchestrator that decides what enters the pool and what leaves it.

It reads the config (budget B, slot limit, pinned names, quality threshold), validates incoming
adapters against their base, and turns storage pressure into a decision: store when it fits;
else merge into one of the most similar stored adapters if the quality gate passes (kmerge.py);
else evict by request-rate-weighted LRU (never pinned) or refuse, as `pool.on_no_merge` says.
Lowering the budget evicts the same way.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zenedge import config as config_mod
from zenedge.adapters.peft_lora import read_lora_dir
from zenedge.adapters.targets import is_servable
from zenedge.bases import DEFAULT_BASE, ensure_base, find_base, identities
from zenedge.config import Config
from zenedge.errors import BaseNotFound, BudgetExceeded, InvalidAdapter, InvalidInput
from zenedge.names import check_name
from zenedge.phases import Phases, Progress
from zenedge.sizes import format_size
from zenedge.store import NewAdapter, NewName, Store


# Gate at most this many candidates, most similar first: each costs a pass over its members' eval
# sets, and the issue [J] profile (BENCHMARKS.md) counts how often a later one is the one kept.
MERGE_CANDIDATES = 2


@dataclass
class EvictionPlan:
    budget: int
    used_before: int
    evict: list[dict[str, Any]] = field(default_factory=list)   # adapter rows, in order
    used_after: int = 0

    @property
    def names(self) -> list[str]:
        return [n for a in self.evict for n in a["names"]]


def resolve_base(store: Store, name: str | None, progress: Progress | None = None) -> dict[str, Any]:
    """The base row for `name` (default: the embedded base, converted into the store on first use,
    reporting progress, as `pull` does)."""
    name = name or DEFAULT_BASE
    row = store.base(name) or find_base(store, name)
    if row is not None:
        return row
    if name == DEFAULT_BASE:
        report = (lambda message: progress({"status": message, "phase": "base"})) if progress else None
        if report:
            report(f"setting up the base {DEFAULT_BASE} (first use, about 30 s)")
        return ensure_base(store, name, progress=report)
    known = ", ".join(b["name"] for b in store.bases()) or "none yet"
    raise BaseNotFound(f"base {name!r} is not registered (registered: {known})",
                       hint="register it with `zenedge base add PATH --name NAME`")


def check_source(path: Path) -> None:
    """Refuse a missing adapter path before anything slow (the default base's first-use set-up)."""
    if not Path(path).exists():
        raise InvalidInput(f"{path}: no such file or directory",
                           hint="give a PEFT LoRA directory or a .bitdelta file")


def check_eval_set(path: Path | None) -> Path | None:
    """Refuse an eval set that is not a readable JSONL of prompt/answer pairs now, before it is
    stored (a broken set would otherwise surface in some later, unrelated merge)."""
    if path is None:
        return None
    from zenedge.evaluation import load_eval_set

    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"eval set {path}: {'is a directory' if path.is_dir() else 'no such file'}",
                           hint="give a JSONL file of {\"prompt\", \"answer\"} lines")
    load_eval_set(path)  # EvalSetError (one line naming the file and line) if it is not one
    return path


def import_lora(store: Store, cfg: Config, path: Path, name: str, *, base: str | None = None,
                eval_path: Path | None = None, version: str = "", description: str = "",
                origin: dict[str, Any] | None = None, engine=None,
                progress: Progress | None = None) -> dict[str, Any]:
    """Validate a PEFT LoRA directory against its base and store it under `name`."""
    check_name(name, "profile name")
    check_source(path)
    check_eval_set(eval_path)
    base_row = resolve_base(store, base, progress)
    modules = {m: tuple(s) for m, s in base_row["modules"].items()}
    lora = read_lora_dir(Path(path), modules)
    unservable = [m for m in lora.target_modules if not is_servable(m)]
    if unservable:
        raise InvalidAdapter(f"{Path(path).name}: targets {', '.join(unservable[:3])}; zenedge applies adapters to the "
                             "attention and MLP projections of the decoder layers only")
    adapter = NewAdapter(
        kind="lora", base=base_row["name"], weights=lora.weights, rank=lora.rank,
        target_modules=lora.target_modules, config=lora.config,
        origin=origin or {"source": "import", "path": str(Path(path).resolve())},
        pinned=name in cfg.get("runtime", "pinned"),
    )
    entry = NewName(name=name, version=version, description=description, eval_path=eval_path,
                    origin=adapter.origin)
    return store_adapter(store, cfg, adapter, entry, engine=engine, progress=progress)


def import_bitdelta(store: Store, cfg: Config, path: Path, name: str, *, base: str | None = None,
                    eval_path: Path | None = None, version: str = "", description: str = "",
                    origin: dict[str, Any] | None = None, engine=None,
                    progress: Progress | None = None) -> dict[str, Any]:
    """Validate a BitDelta file (format, shapes against the base, base hash) and store it."""
    from zenedge.bitdelta.fileformat import load_bitdelta

    check_name(name, "profile name")
    check_source(path)
    check_eval_set(eval_path)
    base_row = resolve_base(store, base, progress)
    if Path(path).suffix.lower() in {".bin", ".pt", ".pth", ".pkl", ".ckpt"}:
        raise InvalidAdapter(f"{Path(path).name}: pickle files are refused; BitDelta files are safetensors")
    try:
        delta = load_bitdelta(Path(path))
    except (ValueError, OSError) as exc:
        raise InvalidAdapter(f"{Path(path).name}: {exc}") from None
    if delta.extra:
        raise InvalidAdapter(f"{Path(path).name}: changes non-projection tensors ({', '.join(sorted(delta.extra)[:3])}), "
                             "which cannot be applied per request; fine-tune projections only")
    modules = base_row["modules"]
    for module, (packed, _, in_features) in delta.modules.items():
        shape = modules.get(module)
        if shape is None or shape[0] != packed.shape[0] or shape[1] != in_features:
            raise InvalidAdapter(f"{Path(path).name}: module {module!r} does not match the base {base_row['name']!r}; "
                                 "the delta was made for another model")
    expected = delta.base_sha256
    if expected and expected not in identities(base_row):
        raise InvalidAdapter(f"{Path(path).name}: made for a different base (sha256 {expected[:12]}…, "
                             f"{base_row['name']!r} is {base_row['sha256'][:12]}…)")
    adapter = NewAdapter(
        kind="bitdelta", base=base_row["name"], weights=Path(path), rank=0,
        target_modules=sorted(delta.modules), config={k: v for k, v in delta.metadata.items()},
        origin=origin or {"source": "import", "path": str(Path(path).resolve())},
        pinned=name in cfg.get("runtime", "pinned"),
    )
    entry = NewName(name=name, version=version, description=description, eval_path=eval_path,
                    origin=adapter.origin)
    return store_adapter(store, cfg, adapter, entry, engine=engine, progress=progress)


def check_admission(store: Store, cfg: Config, name: str, size: int, kind: str) -> None:
    """Before a download: refuse early only what no merge or eviction could ever admit."""
    if size > cfg.budget:
        raise BudgetExceeded(f"{name!r} needs {format_size(size)}, more than the whole "
                             f"{format_size(cfg.budget)} budget", hint="raise it with `zenedge budget set SIZE`")
    if kind == "lora" or cfg.get("pool", "on_no_merge") == "evict":
        return  # a merge or an eviction can make room; the policy decides after the download
    if store.used_bytes() + size > cfg.budget:
        raise BudgetExceeded(
            f"{name!r} needs {format_size(size)} but only {format_size(max(0, cfg.budget - store.used_bytes()))} "
            f"of the {format_size(cfg.budget)} budget is free, and pool.on_no_merge is \"refuse\"",
            hint="free space with `zenedge rm NAME` or raise it with `zenedge budget set SIZE`")


def store_adapter(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, event: str = "import",
                  engine=None, progress: Progress | None = None) -> dict[str, Any]:
    """Commit an adapter within the budget and slot limit. Under pressure a LoRA is merged into the
    most similar stored adapter if the quality gate passes; otherwise the policy evicts
    (rate-weighted LRU, never pinned) or refuses, as `pool.on_no_merge` says. The result carries
    `profile`: where the time went (phases.py)."""
    phases = Phases(progress)
    with store.writing():
        result = _store_adapter(store, cfg, adapter, entry, event, engine, phases)
    return {**result, "profile": phases.profile()}


def _store_adapter(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, event: str, engine,
                   phases: Phases) -> dict[str, Any]:
    attempts: list[dict[str, Any]] = []
    mergeable = adapter.kind in ("lora", "bitdelta")
    if mergeable and _prefers_merge(store, cfg, adapter):
        merged = _merge_under_pressure(store, cfg, adapter, entry, engine, attempts, phases)
        if merged:
            return merged
    try:
        with phases.attempt("commit", f"stored {entry.name}"):
            return _commit(store, cfg, adapter, entry, event, action="stored")
    except BudgetExceeded as pressure:
        if mergeable and not attempts:
            merged = _merge_under_pressure(store, cfg, adapter, entry, engine, attempts, phases)
            if merged:
                return merged
        if cfg.get("pool", "on_no_merge") == "refuse":
            best = max(attempts, key=lambda a: min(a["retention"].values(), default=0), default=None)
            detail = f"; best merge kept {best['retention']}" if best else "; nothing could be merged"
            raise BudgetExceeded(f"{pressure.message}{detail}; nothing was changed (pool.on_no_merge = \"refuse\")",
                                 hint=pressure.hint or "raise the budget or remove a profile") from None
        return _evict_until_it_fits(store, cfg, adapter, entry, event, pressure, attempts, phases)


def _commit(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, event: str, action: str,
            **extra: Any) -> dict[str, Any]:
    adapter_id = store.put_adapter(adapter, [entry], budget=cfg.budget,
                                   max_adapters=cfg.get("pool", "max_adapters"), event=event)
    row = store.adapter(adapter_id)
    return {"name": entry.name, "adapter_id": adapter_id, "kind": row["kind"], "bytes": row["bytes"],
            "action": action, **extra}


def _prefers_merge(store: Store, cfg: Config, adapter: NewAdapter) -> bool:
    """K-Merge++ (`pool.slot_threshold` > 0): with a free slot, still merge when the new adapter is
    similar enough to a stored one. Decided by the merge attempt itself (the gate still applies)."""
    threshold = cfg.get("pool", "slot_threshold")
    kinds = ("bitdelta",) if adapter.kind == "bitdelta" else ("lora", "merged")
    return threshold > 0 and any(a["kind"] in kinds and a["base"] == adapter.base for a in store.adapters())


def _merge_under_pressure(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, engine,
                          attempts: list[dict[str, Any]], phases: Phases,
                          max_candidates: int = MERGE_CANDIDATES) -> dict[str, Any] | None:
    """Try the most similar stored adapters of the same kind; commit the first merge the gate keeps."""
    from zenedge.kmerge import Incoming, PoolMerger

    merger = PoolMerger(store, cfg, _resident(store, cfg, adapter.base, engine), phases)
    if adapter.kind == "bitdelta":
        incoming = Incoming(entry.name, None, entry.eval_path, dict(entry.quality), delta_path=adapter.weights)
        candidates = merger.delta_candidates(incoming, adapter.base)
    else:
        import torch

        from zenedge.adapters.lora_tensors import read_lora_factors

        factors = read_lora_factors(adapter.weights, adapter.config, dtype=torch.float32)
        incoming = Incoming(entry.name, factors, entry.eval_path, dict(entry.quality))
        candidates = merger.candidates(incoming, adapter.base)
    slot_threshold = cfg.get("pool", "slot_threshold")
    for candidate, similarity in candidates[:max_candidates]:
        if slot_threshold > 0 and similarity < slot_threshold and not attempts and _has_room(store, cfg, adapter):
            return None  # K-Merge++: dissimilar to everything and a slot is free: take the slot
        with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as work:
            if adapter.kind == "bitdelta":
                attempt = merger.attempt_delta(candidate, similarity, incoming, Path(work))
            else:
                attempt = merger.attempt(candidate, similarity, incoming)
            attempts.append(attempt.summary())
            entry.quality = incoming.quality
            if not attempt.accepted:
                continue
            try:
                adapter_id = merger.commit(attempt, adapter.base, Path(work), replaces=[candidate["id"]],
                                           budget=cfg.budget, max_adapters=cfg.get("pool", "max_adapters"),
                                           newcomer=entry)
            except BudgetExceeded:
                continue  # merged and still too big: try the next candidate, then evict
        row = store.adapter(adapter_id)
        return {"name": entry.name, "adapter_id": adapter_id, "kind": row["kind"], "bytes": row["bytes"],
                "action": "merged", "merged_with": [n for n in attempt.members if n != entry.name],
                "attempts": attempts}
    return None


def _has_room(store: Store, cfg: Config, adapter: NewAdapter) -> bool:
    size = adapter.weights.stat().st_size
    return (store.used_bytes() + size <= cfg.budget
            and store.usage().adapters < cfg.get("pool", "max_adapters"))


def _evict_until_it_fits(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, event: str,
                         pressure: BudgetExceeded, attempts: list[dict[str, Any]], phases: Phases) -> dict[str, Any]:
    """Plan the evictions first (rate-weighted LRU, never pinned); evict only if the plan works."""
    size = adapter.weights.stat().st_size
    replacing = (store.name(entry.name) or {}).get("adapter_id")
    alone = replacing is not None and len(store.names_of(replacing)) == 1
    used = store.used_bytes() - (store.adapter(replacing)["bytes"] if alone else 0)
    count = store.usage().adapters - (1 if alone else 0)
    over_bytes = used + size - cfg.budget
    over_slots = count + 1 - cfg.get("pool", "max_adapters")
    victims = []
    for victim in store.eviction_order(pinned_names=cfg.get("runtime", "pinned")):
        if over_bytes <= 0 and over_slots <= 0:
            break
        if victim["id"] == replacing:
            continue
        victims.append(victim["id"])
        over_bytes -= victim["bytes"] + _eval_bytes(store, store.names_of(victim["id"]))
        over_slots -= 1
    if over_bytes > 0 or over_slots > 0:
        raise BudgetExceeded(f"{pressure.message}; evicting every unpinned adapter would not make room",
                             hint=pressure.hint) from None
    names = [n for victim in victims for n in store.names_of(victim)]
    with phases.phase("evict", f"evicting {', '.join(names)} to make room for {entry.name}", evicted=names):
        evicted = store.evict(victims, reason=f"making room for {entry.name!r}")
    with phases.phase("commit", f"storing {entry.name}"):
        return _commit(store, cfg, adapter, entry, event, action="evicted", evicted=evicted, attempts=attempts)


def _resident(store: Store, cfg: Config, base: str, engine=None):
    if engine is None:
        from zenedge.runtime.engine import Engine

        engine = Engine(store, cfg)
    return engine.resident(base)


def plan_budget(store: Store, cfg: Config, budget: int) -> EvictionPlan:
    """Which adapters `budget set` would evict (rate-weighted LRU, never pinned)."""
    used = store.used_bytes()
    plan = EvictionPlan(budget=budget, used_before=used, used_after=used)
    for adapter in store.eviction_order(pinned_names=cfg.get("runtime", "pinned")):
        if plan.used_after <= budget:
            break
        names = store.names_of(adapter["id"])
        freed = adapter["bytes"] + _eval_bytes(store, names)
        plan.evict.append({**adapter, "names": names, "freed": freed})
        plan.used_after -= freed
    if plan.used_after > budget:
        raise BudgetExceeded(
            f"pinned adapters alone use {format_size(plan.used_after)}, more than {format_size(budget)}; "
            "nothing was changed",
            hint="unpin some with `zenedge unpin NAME` or choose a larger budget",
        )
    return plan


def _eval_bytes(store: Store, names: list[str]) -> int:
    total = 0
    for name in names:
        row = store.name(name)
        if row and row.get("eval_blob"):
            shared = store.db.execute("SELECT COUNT(*) FROM names WHERE eval_blob = ?", [row["eval_blob"]]).fetchone()[0]
            if shared == 1:
                total += store.db.execute("SELECT bytes FROM blobs WHERE digest = ?", [row["eval_blob"]]).fetchone()[0]
    return total


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
        with store.db.atomic():
            store._event("budget", None, None, {"budget": budget, "evicted": plan.names})
    return plan


def enforce_budget(store: Store, cfg: Config) -> EvictionPlan:
    """Bring the pool back under the configured budget (after a config edit); used by maintenance."""
    with store.writing():
        plan = plan_budget(store, cfg, cfg.budget)
        if plan.evict:
            store.evict([a["id"] for a in plan.evict], reason="over the configured budget")
        return plan
