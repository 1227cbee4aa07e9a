"""K-Merge in the pool: when a new LoRA does not fit, merge it into the most similar stored
adapter with low-rank OPCM (continuing that adapter's stored OPCM state), keep the merge only if
every member keeps at least `pool.quality_threshold` of its gain, else try the next candidate.

Similarity is K-Merge's (mean cosine of B·A over shared modules, in low rank). Pinned adapters
are never merged (the user asked for them exactly as they are).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zenedge.adapters.lora_tensors import read_lora_factors, round_to, stored_dtype, write_peft_adapter
from zenedge.config import Config
from zenedge.merge import LowRankOPCMState, LoraFactors, lowrank_opcm_init, lowrank_opcm_step, rank_by_similarity
from zenedge.phases import Phases
from zenedge.quality import GateResult, Measurement, Member, QualityGate
from zenedge.runtime.model import ResidentModel
from zenedge.runtime.variants import Variant, lora_variant
from zenedge.store import NewAdapter, NewName, Store

MERGEABLE = ("lora", "merged")
EDITS_ONE = {"monosoup"}  # manual methods that rewrite a single adapter; every other needs two or more
OPCM_ALPHA = 0.5


@dataclass
class Incoming:
    """The adapter asking for a place: its name, eval set, and weights (LoRA factors or a delta file)."""

    name: str
    factors: dict[str, LoraFactors] | None
    eval_path: Path | None
    quality: dict[str, Any] = field(default_factory=dict)
    delta_path: Path | None = None  # a .bitdelta file (then factors is None)


@dataclass
class Attempt:
    candidate_id: str
    members: list[str]
    similarity: float
    measurements: list[Measurement]
    threshold: float
    state: Any = None              # LowRankOPCMState for LoRA merges, a dict for 1-bit merges
    merged_path: Path | None = None  # the re-binarised file of a 1-bit merge
    qualities: dict[str, dict[str, Any]] = field(default_factory=dict)  # anchors measured on the way
    dtype: torch.dtype = torch.float32  # what a LoRA merge is stored in: the replaced adapter's dtype

    @property
    def min_retention(self) -> float:
        return min((m.retention for m in self.measurements), default=0.0)

    @property
    def accepted(self) -> bool:
        """Every member measured and passed (the gate's verdict: early verdicts are sequential)."""
        return bool(self.measurements) and len(self.measurements) == len(self.members) \
            and all(m.passed for m in self.measurements)

    def summary(self) -> dict[str, Any]:
        return {"candidate": self.candidate_id[:12], "members": self.members, "similarity": round(self.similarity, 4),
                "retention": {m.name: round(m.retention, 4) for m in self.measurements},
                "examples": {m.name: m.examples for m in self.measurements if m.metric == "loss"},
                "accepted": self.accepted}


def rank_cap(cfg: Config, *adapters: dict[str, LoraFactors]) -> int:
    setting = cfg.get("pool", "merge_rank")
    if setting == "member":
        return max(f.rank for a in adapters for f in a.values())
    return int(setting)


class PoolMerger:
    def __init__(self, store: Store, cfg: Config, resident: ResidentModel, phases: Phases | None = None):
        self.store = store
        self.cfg = cfg
        self.resident = resident
        self.gate = QualityGate(resident)
        self.phases = phases or Phases()

    def factors(self, adapter: dict[str, Any]) -> dict[str, LoraFactors]:
        return read_lora_factors(self.store.blob_path(adapter["sha256"]), adapter["config"], dtype=torch.float32)

    def variant(self, key: str, factors: dict[str, LoraFactors]) -> Variant:
        return lora_variant(key, factors, self.resident)

    def candidates(self, incoming: Incoming, base: str) -> list[tuple[dict[str, Any], float]]:
        """Stored LoRA/merged adapters of `base`, most similar first (pinned ones excluded)."""
        pinned = {self.store.name(n)["adapter_id"] for n in self.cfg.get("runtime", "pinned") if self.store.name(n)}
        rows = {a["id"]: a for a in self.store.adapters()
                if a["kind"] in MERGEABLE and a["base"] == base and not a["pinned"] and a["id"] not in pinned}
        with self.phases.phase("rank", f"ranking {len(rows)} stored adapters by similarity to {incoming.name}",
                               stored=len(rows)):
            pool = {key: self.factors(row) for key, row in rows.items()}
            return [(rows[key], sim) for key, sim in rank_by_similarity(incoming.factors, pool)]

    def _eval_path(self, name_row: dict[str, Any]) -> Path | None:
        return self.store.blob_path(name_row["eval_blob"]) if name_row.get("eval_blob") else None

    def attempt(self, candidate: dict[str, Any], similarity: float, incoming: Incoming) -> Attempt:
        """Merge a LoRA `incoming` into `candidate` with low-rank OPCM (nothing stored yet) and gate it."""
        into = self._label(candidate)
        with self.phases.phase("fold", f"merging {incoming.name} into {into}", candidate=into):
            stored = self.factors(candidate)
            cap = rank_cap(self.cfg, stored, incoming.factors)
            previous = candidate.get("state") or {}
            if candidate["kind"] == "merged" and "lam" in previous:
                state = LowRankOPCMState(merged=stored, lam=float(previous["lam"]), norms=tuple(previous["norms"]))
            else:
                state = lowrank_opcm_init(stored, cap)
            state = lowrank_opcm_step(state, incoming.factors, OPCM_ALPHA, cap)
        # Stored in the candidate's dtype (bf16 profiles stay bf16: the merge takes the slot's bytes,
        # not twice them), and gated as stored.
        dtype = stored_dtype(self.store.blob_path(candidate["sha256"]))
        attempt = Attempt(candidate["id"], [], similarity, [], self.cfg.get("pool", "quality_threshold"), state,
                          dtype=dtype)
        own = self.variant(candidate["id"], stored)
        return self._gate(attempt, candidate, own, self.variant("candidate-merge", round_to(state.merged, dtype)),
                          incoming, self.variant("incoming", incoming.factors))

    def delta_candidates(self, incoming: Incoming, base: str) -> list[tuple[dict[str, Any], float]]:
        from zenedge.bitdelta.fileformat import load_bitdelta
        from zenedge.delta_merge import delta_cosine

        rows = [a for a in self.store.adapters() if a["kind"] == "bitdelta" and a["base"] == base and not a["pinned"]
                and not set(self.store.names_of(a["id"])) & set(self.cfg.get("runtime", "pinned"))]
        with self.phases.phase("rank", f"ranking {len(rows)} stored deltas by similarity to {incoming.name}",
                               stored=len(rows)):
            new = load_bitdelta(incoming.delta_path).modules
            ranked = [(row, delta_cosine(load_bitdelta(self.store.blob_path(row["sha256"])).modules, new))
                      for row in rows]
            return sorted(ranked, key=lambda pair: -pair[1])

    def attempt_delta(self, candidate: dict[str, Any], similarity: float, incoming: Incoming,
                      workdir: Path) -> Attempt:
        """Dense OPCM of two 1-bit deltas, streamed and re-binarised into `workdir`, then gated."""
        from zenedge.delta_merge import merge_bitdelta_files
        from zenedge.runtime.variants import load_bitdelta as load_variant

        out = workdir / "merged.bitdelta"
        stored = self.store.blob_path(candidate["sha256"])
        into = self._label(candidate)
        with self.phases.phase("fold", f"merging {incoming.name} into {into}", candidate=into):
            state = merge_bitdelta_files(stored, candidate.get("state") or {}, incoming.delta_path, out, OPCM_ALPHA)
        attempt = Attempt(candidate["id"], [], similarity, [], self.cfg.get("pool", "quality_threshold"), state,
                          merged_path=out)
        device = self.resident.device
        return self._gate(attempt, candidate, load_variant(candidate["id"], stored, device),
                          load_variant("candidate-merge", out, device), incoming,
                          load_variant("incoming", incoming.delta_path, device))

    def _label(self, candidate: dict[str, Any]) -> str:
        return "+".join(self.store.names_of(candidate["id"])) or candidate["id"][:12]

    def _gate(self, attempt: Attempt, candidate: dict[str, Any], own: Variant, merged: Variant,
              incoming: Incoming, incoming_variant: Variant) -> Attempt:
        """Measure every member of the candidate and the newcomer on the merged variant (the gate
        stops at the first member that clearly fails; each eval example read is a forward pass,
        the bulk of an arrival's cost)."""
        original = candidate["kind"] != "merged"  # its own adapter still exists: anchors can be taken
        members = [self.member(name, own, original) for name in self.store.names_of(candidate["id"])]
        members.append(Member(incoming.name, incoming.eval_path, incoming.quality, incoming_variant, True))
        attempt.members = [m.name for m in members]
        result = self.gate.check(members, merged, attempt.threshold, self.phases)
        attempt.measurements = result.measurements
        attempt.qualities = result.anchors
        if incoming.name in result.anchors:  # kept for the next candidate: measured once per arrival
            incoming.quality = result.anchors[incoming.name]
        if not attempt.accepted:
            self.keep_anchors(result, exclude=incoming.name)
        return attempt

    def member(self, name: str, current: Variant | None, original: bool) -> Member:
        row = self.store.name(name)
        return Member(name, self._eval_path(row), row.get("quality") or {}, current, original)

    def keep_anchors(self, result: GateResult, exclude: str | None = None) -> None:
        """Anchors measured for stored profiles by a gate whose merge is not kept: stored now, so a
        later gate does not measure them again."""
        for name, quality in result.anchors.items():
            if name != exclude and self.store.name(name) is not None:
                self.store.set_quality(name, quality)

    def write(self, attempt: Attempt, base: str, directory: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
        """The accepted merge as a file to store, its config, and the OPCM state to store with it."""
        if attempt.merged_path is not None:  # a 1-bit merge: already written, re-binarised
            return attempt.merged_path, {"format": "zenedge.bitdelta", "merged": "opcm"}, \
                {**attempt.state, "members": attempt.members}
        config = write_peft_adapter(attempt.state.merged, directory, base_model=base, dtype=attempt.dtype)
        state = {"method": "opcm", "alpha": OPCM_ALPHA, "lam": attempt.state.lam, "norms": list(attempt.state.norms),
                 "members": attempt.members, "energy_kept": attempt.state.truncation.energy_kept_overall,
                 "rank": config["r"]}
        return directory / "adapter_model.safetensors", config, state


    def commit(self, attempt: Attempt, base: str, workdir: Path, *, replaces: list[str], budget: int,
               max_adapters: int | None = None, newcomer=None, source: str = "merge") -> str:
        """Store an accepted merge: one transaction that adds it, re-points every member's name
        (with the quality anchors measured on the way) and deletes the adapters it replaces."""
        with self.phases.phase("commit", "storing the merged adapter"):
            return self._commit(attempt, base, workdir, replaces=replaces, budget=budget,
                                max_adapters=max_adapters, newcomer=newcomer, source=source)

    def _commit(self, attempt: Attempt, base: str, workdir: Path, *, replaces: list[str], budget: int,
                max_adapters: int | None, newcomer, source: str) -> str:
        weights, config, state = self.write(attempt, base, workdir)
        one_bit = attempt.merged_path is not None
        merged = NewAdapter(kind="bitdelta" if one_bit else "merged", base=base, weights=weights,
                            rank=config.get("r", 0), config=config, state=state,
                            target_modules=sorted(self.store.adapter(replaces[0])["target_modules"]) if one_bit
                            else sorted(attempt.state.merged),
                            origin={"source": source, "members": attempt.members})
        names = [member_entry(self.store, n, attempt.qualities.get(n))
                 for n in attempt.members if newcomer is None or n != newcomer.name]
        if newcomer is not None:
            newcomer.quality = attempt.qualities.get(newcomer.name, newcomer.quality)
            names.append(newcomer)
        return self.store.put_adapter(
            merged, names, budget=budget, max_adapters=max_adapters, replaces=replaces, event="merge",
            merge={"members": json.dumps(attempt.members), "method": state.get("method", "opcm"),
                   "similarity": attempt.similarity, "retention": json.dumps(attempt.summary()["retention"])})


def manual_merge(store: Store, cfg: Config, names: list[str], method: str, *, force: bool = False,
                 engine=None, progress=None) -> dict[str, Any]:
    """`zenedge merge A B --method M`: merge the adapters serving `names` by hand, gate reported
    (and enforced unless `force`), the result serving every member's name."""
    from zenedge import policy
    from zenedge.errors import InvalidInput, MergeRejected
    from zenedge.merge import merge as run_method

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
    bases = {row["base"] for row in rows.values()}
    if len(bases) != 1:
        raise InvalidInput("the adapters belong to different bases")
    base = bases.pop()
    phases = Phases(progress)
    merger = PoolMerger(store, cfg, policy._resident(store, cfg, base, engine), phases)
    adapters = [merger.factors(row) for row in rows.values()]
    with phases.phase("fold", f"merging {', '.join(dict.fromkeys(names))} ({method})"):
        result = run_method(method, adapters, max_rank=rank_cap(cfg, *adapters))
    dtype = max((stored_dtype(store.blob_path(row["sha256"])) for row in rows.values()),
                key=lambda d: torch.finfo(d).bits)
    members = [merger.member(name, merger.variant(adapter_id, factors), rows[adapter_id]["kind"] == "lora")
               for adapter_id, factors in zip(rows, adapters) for name in store.names_of(adapter_id)]
    threshold = cfg.get("pool", "quality_threshold")
    gate = merger.gate.check(members, merger.variant("manual-merge", round_to(result.adapter, dtype)), threshold, phases,
                             stop_at_failure=not force)
    retention = {m.name: round(m.retention, 4) for m in gate.measurements}
    if not gate.passed and not force:
        merger.keep_anchors(gate)
        raise MergeRejected(f"{method} merge keeps {retention}, below pool.quality_threshold {threshold}; "
                            "nothing was changed", hint="use --force to keep it anyway")
    member_names = [m.name for m in members]
    with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as work, phases.phase("commit", "storing the merged adapter"):
        config = write_peft_adapter(result.adapter, Path(work), base_model=base, dtype=dtype)
        merged = NewAdapter(kind="merged", base=base, weights=Path(work) / "adapter_model.safetensors",
                            rank=config["r"], target_modules=sorted(result.adapter), config=config,
                            state={"method": method, "members": member_names,
                                   "energy_kept": result.truncation.energy_kept_overall, **_json_safe(result.details)},
                            origin={"source": "merge", "members": member_names, "method": method})
        entries = [member_entry(store, n, gate.anchors.get(n)) for n in member_names]
        adapter_id = store.put_adapter(merged, entries, budget=max(cfg.budget, store.used_bytes()),
                                       replaces=list(rows), event="merge",
                                       merge={"members": json.dumps(member_names), "method": method,
                                              "similarity": None, "retention": json.dumps(retention)})
    return {"adapter_id": adapter_id, "members": member_names, "method": method, "retention": retention,
            "examples": {m.name: m.examples for m in gate.measurements if m.metric == "loss"},
            "energy_kept": result.truncation.energy_kept_overall, "bytes": store.adapter(adapter_id)["bytes"],
            "profile": phases.profile()}


def member_entry(store: Store, name: str, quality: dict[str, Any] | None) -> NewName:
    """A stored profile re-pointed to a merged adapter: everything it had (version, description,
    origin, its eval set) and its quality anchors, updated where the gate measured new ones. (The
    eval set was dropped here once, which silently moved every later gate of a merged member onto
    the data-free proxy.)"""
    row = store.name(name) or {}
    eval_path = store.blob_path(row["eval_blob"]) if row.get("eval_blob") else None
    return NewName(name=name, version=row.get("version") or "", description=row.get("description") or "",
                   eval_path=eval_path, quality=quality or row.get("quality") or {}, origin=row.get("origin") or {})


def _json_safe(details: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in details.items() if isinstance(v, (int, float, str, bool, list))}
