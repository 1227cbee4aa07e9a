"""Admission: what enters the pool. Incoming adapters are validated against their base, then
stored when they fit; else stored adapters are kept in smaller formats where the quality gate
allows (shrink.py); else merged into one of the most similar stored adapters if the quality
gate passes (merger.py, the one merge loop); else, as `pool.on_no_merge` says, the refused merge
losing least (of the two best) or an eviction (request-rate-weighted LRU, fewest profiles first,
never pinned), whichever loses less of the profiles' gains ("least-loss", the default), an
eviction ("evict"), or a refusal.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from zenedge.adapters.peft_lora import CONFIG_NAME, WEIGHTS_NAME, read_lora_dir
from zenedge.adapters.targets import is_servable
from zenedge.bases import ensure_base, identities
from zenedge.digests import file_sha256
from zenedge.config import Config
from zenedge.errors import BudgetExceeded, InvalidAdapter, InvalidInput
from zenedge.files import regular_file
from zenedge.names import check_name
from zenedge.pool.phases import Phases, Progress
from zenedge.pool.results import Admitted, AttemptSummary, ShrinkStep
from zenedge.pool.shrink import Newcomer, shrink
from zenedge.sizes import format_size
from zenedge.store import NewAdapter, NewName, Store


# Gate at most this many candidates, most similar first: fewer lost quality in `zenedge bench merge`
# (an arrival whose third candidate would have taken it evicted a profile instead), and a clear
# refusal is cheap with the sequential gate (BENCHMARKS.md).
MERGE_CANDIDATES = 3
EVAL_SET_MAX_BYTES = 64 << 20   # ~100x the embedded sets; the gate reads at most 64 examples of one
LEAST_LOSS_OPTIONS = 2   # refused merges least-loss admission measures in full before choosing


def check_source(path: Path) -> None:
    """Refuse a missing adapter path, or one that is neither a directory nor a regular file (a
    FIFO would block the reader), nor a directory whose PEFT files are not regular files, before
    anything slow (the default base's first-use set-up)."""
    hint = "give a PEFT LoRA directory or a .bitdelta file"
    if not Path(path).exists():
        raise InvalidInput(f"{path}: no such file or directory", hint=hint)
    if not Path(path).is_dir():
        regular_file(Path(path), "adapter file", hint=hint)
        return
    for name in (CONFIG_NAME, WEIGHTS_NAME):   # a missing one: read_lora_dir says what is expected
        if os.path.lexists(Path(path) / name):
            regular_file(Path(path) / name, "adapter file", hint=hint)


def check_eval_set(path: Path | None) -> Path | None:
    """Refuse an eval set that is not a readable JSONL of prompt/answer pairs now, before it is
    stored (a broken set would otherwise surface in some later, unrelated merge)."""
    if path is None:
        return None
    from zenedge.evaluation import load_eval_set

    path = Path(path)
    regular_file(path, "eval set", EVAL_SET_MAX_BYTES, hint="give a JSONL file of {\"prompt\", \"answer\"} lines")
    load_eval_set(path)  # EvalSetError (one line naming the file and line) if it is not one
    return path


def _checked_inputs(store: Store, name: str, path: Path, eval_path: Path | None, base: str | None,
                    progress: Progress | None) -> dict[str, Any]:
    """What every import checks first, cheapest first: the name, the source path, the eval set;
    then the base row (the default base is set up here on first use)."""
    check_name(name, "profile name")
    check_source(path)
    check_eval_set(eval_path)
    report = (lambda message: progress({"status": message, "phase": "base"})) if progress else None
    return ensure_base(store, base, progress=report)


def import_lora(store: Store, cfg: Config, path: Path, name: str, *, base: str | None = None,
                eval_path: Path | None = None, version: str = "", description: str = "",
                origin: dict[str, Any] | None = None, engine=None,
                progress: Progress | None = None, anchors: dict[str, Any] | None = None) -> Admitted:
    """Validate a PEFT LoRA directory against its base and store it under `name`. `anchors`: the
    eval set's base and own losses as a registry published them (gate.claimed_quality)."""
    base_row = _checked_inputs(store, name, path, eval_path, base, progress)
    modules = {m: tuple(s) for m, s in base_row["modules"].items()}
    lora = read_lora_dir(Path(path), modules)
    unservable = [m for m in lora.target_modules if not is_servable(m)]
    if unservable:
        raise InvalidAdapter(f"{Path(path).name}: targets {', '.join(unservable[:3])}; zenedge applies adapters to the "
                             "attention and MLP projections of the decoder layers only")
    entry = NewName(name=name, version=version, description=description, eval_path=eval_path,
                    quality=_claimed(anchors, eval_path),
                    origin=origin or {"source": "import", "path": str(Path(path).resolve())})
    with store.writing(), tempfile.TemporaryDirectory(dir=store.blobs.tmp) as work:
        adapter = NewAdapter(
            kind="lora", base=base_row["name"], weights=_as_stored(lora.weights, cfg, Path(work)), rank=lora.rank,
            target_modules=lora.target_modules, config=lora.config, origin=entry.origin,
        )
        return store_adapter(store, cfg, adapter, entry, engine=engine, progress=progress)


def _as_stored(weights: Path, cfg: Config, workdir: Path) -> Path:
    """The file to store for a PEFT weights file: with `pool.store_dtype = "bf16"` (the default),
    float32 (and float64) tensors are written in bf16, half the bytes at a rounding that changes
    outputs far less than any merge (the keys, and so the adapter's config, stay as they are)."""
    from zenedge.adapters.safetensors_file import read_header

    if cfg.pool.store_dtype == "given" or not {"F32", "F64"} & {t.dtype for t in read_header(weights).tensors.values()}:
        return weights
    from safetensors.torch import load_file

    from zenedge.adapters.storage import encoded_file

    path = workdir / "adapter_model.safetensors"
    path.write_bytes(encoded_file(load_file(weights), "bf16"))
    return path


def _claimed(anchors: dict[str, Any] | None, eval_path: Path | None) -> dict[str, Any]:
    from zenedge.pool.gate import claimed_quality

    return claimed_quality(anchors) if anchors and eval_path else {}


def import_path(store: Store, cfg: Config, path: Path, name: str, **options: Any) -> Admitted:
    """`zenedge import PATH`: a directory (or nothing there: the LoRA importer says so) is a PEFT
    LoRA, a file a .bitdelta; `options` go to that importer."""
    importer = import_lora if path.is_dir() or not path.exists() else import_bitdelta
    return importer(store, cfg, path, name, **options)


def import_bitdelta(store: Store, cfg: Config, path: Path, name: str, *, base: str | None = None,
                    eval_path: Path | None = None, version: str = "", description: str = "",
                    origin: dict[str, Any] | None = None, engine=None,
                    progress: Progress | None = None, anchors: dict[str, Any] | None = None) -> Admitted:
    """Validate a BitDelta file (format, shapes against the base, base hash) and store it."""
    from zenedge.bitdelta.fileformat import load_bitdelta

    base_row = _checked_inputs(store, name, path, eval_path, base, progress)
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
    )
    entry = NewName(name=name, version=version, description=description, eval_path=eval_path,
                    quality=_claimed(anchors, eval_path), origin=adapter.origin)
    return store_adapter(store, cfg, adapter, entry, engine=engine, progress=progress)


def check_admission(store: Store, cfg: Config, name: str, size: int, kind: str) -> None:
    """Before a download: refuse early only what no merge or eviction could ever admit."""
    if size > cfg.budget:
        raise BudgetExceeded(f"{name!r} needs {format_size(size)}, more than the whole "
                             f"{format_size(cfg.budget)} budget", hint="raise it with `zenedge budget set SIZE`")
    if kind == "lora" or cfg.pool.on_no_merge == "evict":
        return  # a merge or an eviction can make room; the policy decides after the download
    if store.used_bytes() + size > cfg.budget:
        raise BudgetExceeded(
            f"{name!r} needs {format_size(size)} but only {format_size(max(0, cfg.budget - store.used_bytes()))} "
            f"of the {format_size(cfg.budget)} budget is free, and pool.on_no_merge is \"refuse\"",
            hint="free space with `zenedge rm NAME` or raise it with `zenedge budget set SIZE`")


def store_adapter(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, event: str = "import",
                  engine=None, progress: Progress | None = None) -> Admitted:
    """Commit an adapter within the budget and slot limit. Under pressure a LoRA is merged into the
    most similar stored adapter if the quality gate passes; otherwise the policy evicts
    (rate-weighted LRU, never pinned) or refuses, as `pool.on_no_merge` says. The result carries
    `profile`: where the time went (phases.py)."""
    phases = Phases(progress)
    size = adapter.weights.stat().st_size + (entry.eval_path.stat().st_size if entry.eval_path else 0)
    store.ensure_disk_space(size, f"storing {entry.name!r}")
    compressed: list[ShrinkStep] = []
    with store.writing(), tempfile.TemporaryDirectory(dir=store.blobs.tmp) as work:
        newcomer = Newcomer(adapter, entry, Path(work))
        result = _store_adapter(store, cfg, newcomer, event, engine, phases, compressed)
    return replace(result, compressed=compressed, profile=phases.profile())


@dataclass
class Refused:
    """A LoRA merge the gate refused, with what least-loss admission needs to measure or keep it."""

    attempt: Any       # merger.Attempt
    merger: Any        # the merger.PoolMerger that made it
    incoming: Any      # merger.Incoming


def _store_adapter(store: Store, cfg: Config, newcomer: Newcomer, event: str, engine, phases: Phases,
                   compressed: list[ShrinkStep]) -> Admitted:
    """Store if it fits; else store adapters smaller (shrink.py), else merge, else the policy."""
    attempts: list[AttemptSummary] = []
    refused: list[Refused] = []
    adapter, entry = newcomer.adapter, newcomer.entry
    mergeable = adapter.kind in ("lora", "bitdelta")
    if mergeable and _prefers_merge(store, cfg, adapter):
        merged = _merge_under_pressure(store, cfg, adapter, entry, engine, attempts, phases, refused)
        if merged:
            return merged
    stored, pressure = _store_if_room(store, cfg, adapter, entry, event, phases)
    if stored is None:
        steps = shrink(store, cfg, _bytes_over(store, cfg, newcomer), phases, engine=engine, newcomer=newcomer)
        compressed += steps
        if any(step.kept for step in steps):
            adapter = newcomer.adapter   # the newcomer itself may have been stored smaller
            stored, pressure = _store_if_room(store, cfg, adapter, entry, event, phases)
    if stored is not None:
        return stored
    if mergeable and not attempts:
        merged = _merge_under_pressure(store, cfg, adapter, entry, engine, attempts, phases, refused)
        if merged:
            return merged
    if cfg.pool.on_no_merge == "refuse":
        best = max(attempts, key=lambda a: min(a.retention.values(), default=0), default=None)
        detail = f"; best merge kept {best.retention}" if best else "; nothing could be merged"
        raise BudgetExceeded(f"{pressure.message}{detail}; nothing was changed (pool.on_no_merge = \"refuse\")",
                             hint=pressure.hint or "raise the budget or remove a profile") from None
    victims = _eviction_plan(store, cfg, adapter, entry, pressure)
    if cfg.pool.on_no_merge == "least-loss" and refused:
        merged = _least_loss_merge(store, cfg, adapter, entry, engine, refused, victims, attempts, phases)
        if merged:
            return merged
    return _evict(store, cfg, adapter, entry, event, victims, attempts, phases)


def _store_if_room(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, event: str,
                   phases: Phases) -> tuple[Admitted | None, BudgetExceeded | None]:
    """Commit the newcomer as it is if the budget and the slot limit allow: (its result, None),
    else (None, why not)."""
    try:
        with phases.attempt("commit", f"stored {entry.name}"):
            return _commit(store, cfg, adapter, entry, event, action="stored"), None
    except BudgetExceeded as pressure:
        return None, pressure


def _commit(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, event: str, action: str,
            **details: Any) -> Admitted:
    adapter_id = store.put_adapter(adapter, [entry], budget=cfg.budget,
                                   max_adapters=cfg.pool.max_adapters, event=event)
    row = store.adapter(adapter_id)
    return Admitted(entry.name, adapter_id, row["kind"], row["bytes"], action, **details)


def _prefers_merge(store: Store, cfg: Config, adapter: NewAdapter) -> bool:
    """K-Merge++ (`pool.slot_threshold` > 0): with a free slot, still merge when the new adapter is
    similar enough to a stored one. Decided by the merge attempt itself (the gate still applies)."""
    threshold = cfg.pool.slot_threshold
    kinds = ("bitdelta",) if adapter.kind == "bitdelta" else ("lora", "merged")
    return threshold > 0 and any(a["kind"] in kinds and a["base"] == adapter.base for a in store.adapters())


def _merge_under_pressure(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, engine,
                          attempts: list[AttemptSummary], phases: Phases,
                          refused: list[Refused]) -> Admitted | None:
    """Try the MERGE_CANDIDATES most similar stored adapters of the same kind (merger.py's loop)."""
    from zenedge.pool.merger import PoolMerger  # torch loads here, only when a merge is tried

    merger = PoolMerger.for_base(store, cfg, adapter.base, engine, phases)
    incoming = _incoming(adapter, entry)
    candidates = merger.ranked(incoming, adapter.base)[:MERGE_CANDIDATES]
    slot_threshold = cfg.pool.slot_threshold
    if (candidates and slot_threshold > 0 and candidates[0][1] < slot_threshold and not attempts
            and _has_room(store, cfg, adapter)):
        return None  # K-Merge++: dissimilar to everything and a slot is free: take the slot
    kept_out: list = []
    merged = merger.merge_first_kept(incoming, adapter.base, candidates, attempts=attempts, budget=cfg.budget,
                                     max_adapters=cfg.pool.max_adapters, newcomer=entry, refused=kept_out)
    if merged is None:
        refused += [Refused(attempt, merger, incoming) for attempt in kept_out]
        return None
    adapter_id, attempt = merged
    return _merged_result(store, entry, adapter_id, attempt, attempts)


def _merged_result(store: Store, entry: NewName, adapter_id: str, attempt, attempts: list[AttemptSummary],
                   **least_loss: Any) -> Admitted:
    row = store.adapter(adapter_id)
    return Admitted(entry.name, adapter_id, row["kind"], row["bytes"], "merged",
                    merged_with=[n for n in attempt.members if n != entry.name], attempts=attempts, **least_loss)


def _least_loss_merge(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, engine, refused: list[Refused],
                      victims: list[str], attempts: list[AttemptSummary], phases: Phases) -> Admitted | None:
    """`pool.on_no_merge = "least-loss"`: no merge kept every member above the threshold, so room
    costs quality either way. Evicting loses the evicted profiles' whole gains; a refused merge,
    measured on every member, loses what it does not keep of each. The LEAST_LOSS_OPTIONS refused
    merges whose failing member kept the most are measured (the gate stopped at their first failure,
    so that is all that is known of them) and the one that loses least is taken if it loses less."""
    evicted = sum(len(store.names_of(v)) for v in victims)
    options = sorted(refused, key=lambda r: r.attempt.min_retention, reverse=True)[:LEAST_LOSS_OPTIONS]
    best: Refused | None = None
    for option in options:  # one refused attempt per candidate (merger.merge_first_kept gates each once)
        # A status line only: the gate passes inside record their own time (a timed phase here would
        # count them twice in the profile).
        phases.note(f"weighing a refused merge into {option.merger.label(option.attempt.candidate)} against evicting "
                    f"{evicted} profile{'s' if evicted != 1 else ''}", "gate",
                    candidate=option.attempt.candidate_id[:12])
        option.merger.measure_all(option.attempt, option.incoming)
        attempts.append(option.attempt.summary(lost_gain=round(option.attempt.lost_gain, 4), eviction_loses=evicted))
        if best is None or option.attempt.lost_gain < best.attempt.lost_gain:
            best = option
    if best is None or best.attempt.lost_gain >= evicted:
        return None
    lost = best.attempt.lost_gain
    with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as work:
        try:
            adapter_id = best.merger.commit(best.attempt, adapter.base, Path(work),
                                            replaces=[best.attempt.candidate_id], budget=cfg.budget,
                                            max_adapters=cfg.pool.max_adapters, newcomer=entry)
        except BudgetExceeded:
            return None
    return _merged_result(store, entry, adapter_id, best.attempt, attempts, below_threshold=True,
                          lost_gain=round(lost, 4), eviction_would_lose=evicted)


def _incoming(adapter: NewAdapter, entry: NewName):
    """The newcomer as the merger sees it: its LoRA factors, or its .bitdelta file."""
    from zenedge.pool.merger import Incoming

    key = f"incoming-{file_sha256(adapter.weights)[:16]}"
    if adapter.kind == "bitdelta":
        return Incoming(entry.name, None, entry.eval_path, dict(entry.quality), delta_path=adapter.weights, key=key)
    import torch

    from zenedge.adapters.lora_tensors import read_lora_factors

    factors = read_lora_factors(adapter.weights, adapter.config, dtype=torch.float32)
    return Incoming(entry.name, factors, entry.eval_path, dict(entry.quality), key=key)


def _bytes_over(store: Store, cfg: Config, newcomer: Newcomer) -> int:
    """How far storing the newcomer (its weights and eval set) would take the pool over B."""
    eval_path = newcomer.entry.eval_path
    size = newcomer.adapter.weights.stat().st_size + (eval_path.stat().st_size if eval_path else 0)
    return store.used_bytes() + size - cfg.budget


def _has_room(store: Store, cfg: Config, adapter: NewAdapter) -> bool:
    size = adapter.weights.stat().st_size
    return (store.used_bytes() + size <= cfg.budget
            and store.usage().adapters < cfg.pool.max_adapters)


def _eviction_plan(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName,
                   pressure: BudgetExceeded) -> list[str]:
    """The adapters to evict for the newcomer to fit (rate-weighted LRU, fewest profiles first,
    never pinned), planned before anything is evicted: refused if even all of them would not do."""
    size = adapter.weights.stat().st_size
    replacing = (store.name(entry.name) or {}).get("adapter_id")
    alone = replacing is not None and len(store.names_of(replacing)) == 1
    used = store.used_bytes() - (store.adapter(replacing)["bytes"] if alone else 0)
    count = store.usage().adapters - (1 if alone else 0)
    over_bytes = used + size - cfg.budget
    over_slots = count + 1 - cfg.pool.max_adapters
    victims = []
    for victim in store.eviction_order(pinned_names=cfg.runtime.pinned):
        if over_bytes <= 0 and over_slots <= 0:
            break
        if victim["id"] == replacing:
            continue
        victims.append(victim["id"])
        over_bytes -= store.freed_by_evicting(victim["id"])
        over_slots -= 1
    if over_bytes > 0 or over_slots > 0:
        raise BudgetExceeded(f"{pressure.message}; evicting every unpinned adapter would not make room",
                             hint=pressure.hint) from None
    return victims


def _evict(store: Store, cfg: Config, adapter: NewAdapter, entry: NewName, event: str, victims: list[str],
           attempts: list[AttemptSummary], phases: Phases) -> Admitted:
    names = [n for victim in victims for n in store.names_of(victim)]
    with phases.phase("evict", f"evicting {', '.join(names)} to make room for {entry.name}", evicted=names):
        evicted = store.evict(victims, reason=f"making room for {entry.name!r}")
    with phases.phase("commit", f"storing {entry.name}"):
        return _commit(store, cfg, adapter, entry, event, action="evicted", evicted=evicted, attempts=attempts)
