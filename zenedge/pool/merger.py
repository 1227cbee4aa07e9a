"""Merging in the pool: K-Merge's candidates, the fold, the quality gate, the commit, and THE
loop that tries them (`PoolMerger.merge_first_kept`), used by admission under pressure and by
maintenance; a manual merge (manual.py) goes through the same gate and the same commit.

A LoRA newcomer is merged into the most similar stored adapter with low-rank OPCM (continuing
that adapter's stored OPCM state); a 1-bit delta into the most similar stored delta with dense
OPCM, re-binarised (bitdelta/merge.py). The merge is kept only if every member keeps at least
`pool.quality_threshold` of its gain (gate.py), else the next candidate is tried.

Similarity is K-Merge's (mean cosine of B·A over shared modules, in low rank). Pinned adapters
are never merged (the user asked for them exactly as they are).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from zenedge.adapters.lora_tensors import read_lora_factors, round_to, stored_format, write_peft_adapter
from zenedge.config import Config
from zenedge.errors import BudgetExceeded
from zenedge.merge import LowRankOPCMState, LoraFactors, lowrank_opcm_init, lowrank_opcm_step, rank_by_similarity
from zenedge.pool.gate import GateResult, Measurement, Member, QualityGate
from zenedge.pool.phases import Phases
from zenedge.pool.results import AttemptSummary
from zenedge.runtime.model import ResidentModel
from zenedge.runtime.variants import Variant, lora_variant
from zenedge.store import NewAdapter, NewName, Store

MERGEABLE = ("lora", "merged")
OPCM_ALPHA = 0.5


@dataclass
class Incoming:
    """The adapter asking for a place: its name, eval set, and weights (LoRA factors or a delta file)."""

    name: str
    factors: dict[str, LoraFactors] | None
    eval_path: Path | None
    quality: dict[str, Any] = field(default_factory=dict)
    delta_path: Path | None = None  # a .bitdelta file (then factors is None)
    key: str = "incoming"           # its variant's key; the content's hash where known (the gate's memo keys on it)


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
    storage: str = "fp32"          # what a LoRA merge is stored in: the replaced adapter's format (storage.py)
    candidate: dict[str, Any] | None = None  # the stored adapter's row (to measure or commit it later)
    reads: dict[str, Any] = field(default_factory=dict)  # the gate's per-member reads (gate.GateResult.reads)
    gated: tuple[list[Member], Variant] | None = None  # what the gate reads (members, merged variant), to go on

    @property
    def min_retention(self) -> float:
        return min((m.retention for m in self.measurements), default=0.0)

    @property
    def lost_gain(self) -> float:
        """The members' gains this merge would lose, in profiles (0: keeps them all, 1 per member
        kept no better than the base): what evicting a profile costs, for least-loss admission."""
        return sum(1.0 - min(max(m.retention, 0.0), 1.0) for m in self.measurements)

    @property
    def accepted(self) -> bool:
        """Every member measured and passed (the gate's verdict: early verdicts are sequential)."""
        return bool(self.measurements) and len(self.measurements) == len(self.members) \
            and all(m.passed for m in self.measurements)

    def summary(self, **least_loss: Any) -> AttemptSummary:
        return AttemptSummary(self.candidate_id[:12], self.members, round(self.similarity, 4),
                              retention={m.name: round(m.retention, 4) for m in self.measurements},
                              examples={m.name: m.examples for m in self.measurements if m.metric != "proxy"},
                              accepted=self.accepted, **least_loss)


def rank_cap(cfg: Config, *adapters: dict[str, LoraFactors]) -> int:
    setting = cfg.pool.merge_rank
    if setting == "member":
        return max(f.rank for a in adapters for f in a.values())
    return int(setting)


def fold(stored: dict[str, LoraFactors], previous: dict[str, Any] | None, newcomer: dict[str, LoraFactors],
         cap: int) -> LowRankOPCMState:
    """One low-rank OPCM step of `newcomer` into a stored adapter, continuing the OPCM state stored
    with a merged one (`previous`: its "lam" and "norms"), else starting from the adapter alone."""
    if previous and "lam" in previous:
        state = LowRankOPCMState(merged=stored, lam=float(previous["lam"]), norms=tuple(previous["norms"]))
    else:
        state = lowrank_opcm_init(stored, cap)
    return lowrank_opcm_step(state, newcomer, OPCM_ALPHA, cap)


class PoolMerger:
    def __init__(self, store: Store, cfg: Config, resident: ResidentModel, phases: Phases | None = None):
        self.store = store
        self.cfg = cfg
        self.resident = resident
        self.gate = QualityGate(resident)
        self.phases = phases or Phases()

    @classmethod
    def for_base(cls, store: Store, cfg: Config, base: str, engine=None, phases: Phases | None = None) -> PoolMerger:
        """A merger on `base`'s resident model: the running engine's (the daemon's) when there is
        one, so a merge does not load the base a second time; else a fresh engine's."""
        phases = phases or Phases()
        if engine is not None and engine.loaded(base):
            return cls(store, cfg, engine.resident(base), phases)
        with phases.phase("load", f"loading {base} for the quality gate"):
            if engine is None:
                from zenedge.runtime.engine import Engine

                engine = Engine(store, cfg, scoring_only=True)
            resident = engine.resident(base)
        return cls(store, cfg, resident, phases)

    def factors(self, adapter: dict[str, Any]) -> dict[str, LoraFactors]:
        return read_lora_factors(self.store.verified_blob(adapter["sha256"]), adapter["config"], dtype=torch.float32)

    def variant(self, key: str, factors: dict[str, LoraFactors]) -> Variant:
        return lora_variant(key, factors, self.resident)

    def candidates(self, incoming: Incoming, base: str) -> list[tuple[dict[str, Any], float]]:
        """Stored LoRA/merged adapters of `base`, most similar first (pinned ones excluded)."""
        pinned = self.store.pinned_ids(self.cfg.runtime.pinned)
        rows = {a["id"]: a for a in self.store.adapters()
                if a["kind"] in MERGEABLE and a["base"] == base and a["id"] not in pinned}
        with self.phases.phase("rank", f"ranking {len(rows)} stored adapters by similarity to {incoming.name}",
                               stored=len(rows)):
            pool = {key: self.factors(row) for key, row in rows.items()}
            return [(rows[key], sim) for key, sim in rank_by_similarity(incoming.factors, pool)]

    def eval_path(self, name_row: dict[str, Any]) -> Path | None:
        """A profile's stored eval set; None (the gate's data-free proxy) when it is damaged on disk."""
        path = stored_eval_set(self.store, name_row)
        if path is None and name_row.get("eval_blob"):
            self.phases.note(f"{name_row['name']}: eval set unusable (damaged on disk: its bytes no longer match its "
                             "sha256); using the data-free proxy", "gate", member=name_row["name"])
        return path

    def attempt(self, candidate: dict[str, Any], similarity: float, incoming: Incoming) -> Attempt:
        """Merge a LoRA `incoming` into `candidate` with low-rank OPCM (nothing stored yet) and gate it."""
        into = self.label(candidate)
        with self.phases.phase("fold", f"merging {incoming.name} into {into}", candidate=into):
            stored = self.factors(candidate)
            previous = candidate.get("state") if candidate["kind"] == "merged" else None
            state = fold(stored, previous, incoming.factors, rank_cap(self.cfg, stored, incoming.factors))
        # Stored in the candidate's format (bf16 profiles stay bf16, int4 ones int4: the merge takes
        # the slot's bytes, not twice them), and gated as stored.
        storage = stored_format(self.store.blob_path(candidate["sha256"]))
        attempt = Attempt(candidate["id"], [], similarity, [], self.cfg.pool.quality_threshold, state,
                          storage=storage, candidate=candidate)
        members = self._members(candidate, self.variant(candidate["id"], stored), incoming,
                                self.variant(incoming.key, incoming.factors))
        attempt.gated = members, self.variant("candidate-merge", round_to(state.merged, storage))
        return self._gate(attempt, incoming)

    def measure_all(self, attempt: Attempt, incoming: Incoming) -> Attempt:
        """A refused LoRA attempt measured on every member (the gate stopped at the first failure):
        what least-loss admission weighs against an eviction."""
        return self._gate(attempt, incoming, resume=attempt.reads, stop_at_failure=False)

    def delta_candidates(self, incoming: Incoming, base: str) -> list[tuple[dict[str, Any], float]]:
        from zenedge.bitdelta.fileformat import load_bitdelta
        from zenedge.bitdelta.merge import delta_cosine

        pinned = self.store.pinned_ids(self.cfg.runtime.pinned)
        rows = [a for a in self.store.adapters() if a["kind"] == "bitdelta" and a["base"] == base and a["id"] not in pinned]
        with self.phases.phase("rank", f"ranking {len(rows)} stored deltas by similarity to {incoming.name}",
                               stored=len(rows)):
            new = load_bitdelta(incoming.delta_path).modules
            ranked = [(row, delta_cosine(load_bitdelta(self.store.verified_blob(row["sha256"])).modules, new))
                      for row in rows]
            return sorted(ranked, key=lambda pair: -pair[1])

    def attempt_delta(self, candidate: dict[str, Any], similarity: float, incoming: Incoming,
                      workdir: Path) -> Attempt:
        """Dense OPCM of two 1-bit deltas, streamed and re-binarised into `workdir`, then gated."""
        from zenedge.bitdelta.merge import merge_bitdelta_files
        from zenedge.runtime.variants import load_bitdelta as load_variant

        out = workdir / "merged.bitdelta"
        stored = self.store.verified_blob(candidate["sha256"])
        into = self.label(candidate)
        with self.phases.phase("fold", f"merging {incoming.name} into {into}", candidate=into):
            state = merge_bitdelta_files(stored, candidate.get("state") or {}, incoming.delta_path, out, OPCM_ALPHA)
        attempt = Attempt(candidate["id"], [], similarity, [], self.cfg.pool.quality_threshold, state,
                          merged_path=out)
        device = self.resident.device
        members = self._members(candidate, load_variant(candidate["id"], stored, device), incoming,
                                load_variant(incoming.key, incoming.delta_path, device))
        attempt.gated = members, load_variant("candidate-merge", out, device)
        return self._gate(attempt, incoming)

    def ranked(self, incoming: Incoming, base: str) -> list[tuple[dict[str, Any], float]]:
        """Stored adapters `incoming` could merge into, most similar first (deltas with deltas)."""
        if incoming.delta_path is not None:
            return self.delta_candidates(incoming, base)
        return self.candidates(incoming, base)

    def merge_first_kept(self, incoming: Incoming, base: str, candidates: list[tuple[dict[str, Any], float]], *,
                         attempts: list[AttemptSummary], budget: int, max_adapters: int | None = None,
                         also_replaces: tuple[str, ...] = (), newcomer: NewName | None = None,
                         source: str = "merge", refused: list[Attempt] | None = None) -> tuple[str, Attempt] | None:
        """THE loop: merge `incoming` into each candidate in turn (fold, gate) and commit the first
        merge the gate keeps, replacing the candidate (and `also_replaces`). A kept merge the budget
        still refuses moves on to the next candidate. Every attempt's summary is appended to
        `attempts` (and refused LoRA attempts to `refused`, for least-loss admission); returns (the
        merged adapter's id, its attempt), or None when nothing was kept."""
        for candidate, similarity in candidates:
            with tempfile.TemporaryDirectory(dir=self.store.blobs.tmp) as work:
                if incoming.delta_path is not None:
                    attempt = self.attempt_delta(candidate, similarity, incoming, Path(work))
                else:
                    attempt = self.attempt(candidate, similarity, incoming)
                attempts.append(attempt.summary())
                if newcomer is not None:  # anchors measured for the newcomer stay with it, merged or not
                    newcomer.quality = incoming.quality
                if not attempt.accepted:
                    if refused is not None and attempt.merged_path is None:
                        refused.append(attempt)
                    continue
                try:
                    adapter_id = self.commit(attempt, base, Path(work), replaces=[candidate["id"], *also_replaces],
                                             budget=budget, max_adapters=max_adapters, newcomer=newcomer,
                                             source=source)
                except BudgetExceeded:
                    continue  # merged and still too big: the next candidate, then the caller's fallback
            return adapter_id, attempt
        return None

    def label(self, candidate: dict[str, Any]) -> str:
        return "+".join(self.store.names_of(candidate["id"])) or candidate["id"][:12]

    def _gate(self, attempt: Attempt, incoming: Incoming, *, resume: dict[str, Any] | None = None,
              stop_at_failure: bool = True) -> Attempt:
        """Measure every member of the candidate and the newcomer on the merged variant (the gate
        stops at the first member that clearly fails; each eval example read is a forward pass,
        the bulk of an arrival's cost). The newcomer goes in with the anchors measured for it so far
        (by this arrival's earlier attempts)."""
        members, merged = attempt.gated
        members = [replace(m, quality=incoming.quality) if m.name == incoming.name else m for m in members]
        attempt.members = [m.name for m in members]
        result = self.gate.check(members, merged, attempt.threshold, self.phases, resume=resume,
                                 stop_at_failure=stop_at_failure)
        attempt.measurements, attempt.qualities, attempt.reads = result.measurements, result.anchors, result.reads
        if incoming.name in result.anchors:  # kept for the next candidate: measured once per arrival
            incoming.quality = result.anchors[incoming.name]
        if not attempt.accepted:
            self.keep_anchors(result, exclude=incoming.name)
        return attempt

    def _members(self, candidate: dict[str, Any], own: Variant, incoming: Incoming,
                 incoming_variant: Variant) -> list[Member]:
        """Who a merge into `candidate` serves: its profiles (served by `own`), then the newcomer."""
        members = [self.member(name, own, is_original(candidate)) for name in self.store.names_of(candidate["id"])]
        return members + [Member(incoming.name, incoming.eval_path, incoming.quality, incoming_variant, True)]

    def member(self, name: str, current: Variant | None, original: bool) -> Member:
        row = self.store.name(name)
        return Member(name, self.eval_path(row), row.get("quality") or {}, current, original)

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
        config = write_peft_adapter(attempt.state.merged, directory, base_model=base,
                                    storage_format=attempt.storage)
        state = {"method": "opcm", "alpha": OPCM_ALPHA, "lam": attempt.state.lam, "norms": list(attempt.state.norms),
                 "members": attempt.members, "energy_kept": attempt.state.truncation.energy_kept_overall,
                 "rank": config["r"]}
        return directory / "adapter_model.safetensors", config, state

    def commit(self, attempt: Attempt, base: str, workdir: Path, *, replaces: list[str], budget: int,
               max_adapters: int | None = None, newcomer: NewName | None = None, source: str = "merge") -> str:
        """Store an accepted merge: one transaction that adds it, re-points every member's name
        (with the quality anchors measured on the way) and deletes the adapters it replaces."""
        with self.phases.phase("commit", "storing the merged adapter"):
            weights, config, state = self.write(attempt, base, workdir)
            one_bit = attempt.merged_path is not None
            merged = NewAdapter(kind="bitdelta" if one_bit else "merged", base=base, weights=weights,
                                rank=config.get("r", 0), config=config, state=state,
                                target_modules=sorted(self.store.adapter(replaces[0])["target_modules"]) if one_bit
                                else sorted(attempt.state.merged),
                                origin={"source": source, "members": attempt.members})
            return self.store_merge(merged, attempt.members, attempt.qualities, replaces=replaces, budget=budget,
                                    max_adapters=max_adapters, newcomer=newcomer,
                                    method=state.get("method", "opcm"), similarity=attempt.similarity,
                                    retention=attempt.summary().retention)

    def store_merge(self, merged: NewAdapter, members: list[str], anchors: dict[str, dict[str, Any]], *,
                    replaces: list[str], budget: int, max_adapters: int | None, newcomer: NewName | None,
                    method: str, similarity: float | None, retention: dict[str, float]) -> str:
        """The one write of every merge (arrival, maintenance, by hand): the merged adapter, every
        member's name re-pointed to it with what it had and the anchors measured on the way, the
        replaced adapters deleted, and the merge recorded, in one transaction."""
        names = [member_entry(self.store, n, anchors.get(n))
                 for n in members if newcomer is None or n != newcomer.name]
        if newcomer is not None:
            newcomer.quality = anchors.get(newcomer.name, newcomer.quality)
            names.append(newcomer)
        return self.store.put_adapter(
            merged, names, budget=budget, max_adapters=max_adapters, replaces=replaces, event="merge",
            merge={"members": json.dumps(members), "method": method, "similarity": similarity,
                   "retention": json.dumps(retention)})


def is_original(adapter: dict[str, Any]) -> bool:
    """Whether a stored adapter is still the one its profile arrived as (not merged, not re-stored
    smaller), so the gate may measure that profile's own scores (its anchors) on it."""
    return adapter["kind"] != "merged" and not (adapter.get("state") or {}).get("compressed")


def member_entry(store: Store, name: str, quality: dict[str, Any] | None) -> NewName:
    """A stored profile re-pointed to a merged adapter: everything it had (version, description,
    origin, its eval set, so later gates still read it) and its quality anchors, updated where the
    gate measured new ones."""
    row = store.name(name) or {}
    return NewName(name=name, version=row.get("version") or "", description=row.get("description") or "",
                   eval_path=stored_eval_set(store, row), quality=quality or row.get("quality") or {}, origin=row.get("origin") or {})


def stored_eval_set(store: Store, name_row: dict[str, Any]) -> Path | None:
    """A profile's stored eval set; None when it has none, or when its blob is damaged (never a
    damaged copy)."""
    digest = name_row.get("eval_blob")
    return store.blob_path(digest) if digest and store.blobs.verify(digest) else None
