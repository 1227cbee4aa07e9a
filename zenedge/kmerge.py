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

from zenedge.adapters.lora_tensors import read_lora_factors, write_peft_adapter
from zenedge.config import Config
from zenedge.merge import LowRankOPCMState, LoraFactors, lowrank_opcm_init, lowrank_opcm_step, rank_by_similarity
from zenedge.quality import Measurement, QualityGate
from zenedge.runtime.model import ResidentModel
from zenedge.runtime.variants import Variant, lora_variant
from zenedge.store import Store

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

    @property
    def min_retention(self) -> float:
        return min((m.retention for m in self.measurements), default=0.0)

    @property
    def accepted(self) -> bool:
        return self.min_retention >= self.threshold

    def summary(self) -> dict[str, Any]:
        return {"candidate": self.candidate_id[:12], "members": self.members, "similarity": round(self.similarity, 4),
                "retention": {m.name: round(m.retention, 4) for m in self.measurements},
                "accepted": self.accepted}


def rank_cap(cfg: Config, *adapters: dict[str, LoraFactors]) -> int:
    setting = cfg.get("pool", "merge_rank")
    if setting == "member":
        return max(f.rank for a in adapters for f in a.values())
    return int(setting)


class PoolMerger:
    def __init__(self, store: Store, cfg: Config, resident: ResidentModel):
        self.store = store
        self.cfg = cfg
        self.resident = resident
        self.gate = QualityGate(resident)

    def factors(self, adapter: dict[str, Any]) -> dict[str, LoraFactors]:
        return read_lora_factors(self.store.blob_path(adapter["sha256"]), adapter["config"], dtype=torch.float32)

    def variant(self, key: str, factors: dict[str, LoraFactors]) -> Variant:
        return lora_variant(key, factors, self.resident)

    def candidates(self, incoming: Incoming, base: str) -> list[tuple[dict[str, Any], float]]:
        """Stored LoRA/merged adapters of `base`, most similar first (pinned ones excluded)."""
        pinned = {self.store.name(n)["adapter_id"] for n in self.cfg.get("runtime", "pinned") if self.store.name(n)}
        rows = {a["id"]: a for a in self.store.adapters()
                if a["kind"] in MERGEABLE and a["base"] == base and not a["pinned"] and a["id"] not in pinned}
        pool = {key: self.factors(row) for key, row in rows.items()}
        return [(rows[key], sim) for key, sim in rank_by_similarity(incoming.factors, pool)]

    def _eval_path(self, name_row: dict[str, Any]) -> Path | None:
        return self.store.blob_path(name_row["eval_blob"]) if name_row.get("eval_blob") else None

    def attempt(self, candidate: dict[str, Any], similarity: float, incoming: Incoming) -> Attempt:
        """Merge a LoRA `incoming` into `candidate` with low-rank OPCM (nothing stored yet) and gate it."""
        stored = self.factors(candidate)
        cap = rank_cap(self.cfg, stored, incoming.factors)
        previous = candidate.get("state") or {}
        if candidate["kind"] == "merged" and "lam" in previous:
            state = LowRankOPCMState(merged=stored, lam=float(previous["lam"]), norms=tuple(previous["norms"]))
        else:
            state = lowrank_opcm_init(stored, cap)
        state = lowrank_opcm_step(state, incoming.factors, OPCM_ALPHA, cap)
        attempt = Attempt(candidate["id"], [], similarity, [], self.cfg.get("pool", "quality_threshold"), state)
        own = self.variant(candidate["id"], stored)
        return self._gate(attempt, candidate, own, self.variant("candidate-merge", state.merged), incoming,
                          self.variant("incoming", incoming.factors))

    def delta_candidates(self, incoming: Incoming, base: str) -> list[tuple[dict[str, Any], float]]:
        from zenedge.bitdelta.fileformat import load_bitdelta
        from zenedge.delta_merge import delta_cosine

        new = load_bitdelta(incoming.delta_path).modules
        rows = [a for a in self.store.adapters() if a["kind"] == "bitdelta" and a["base"] == base and not a["pinned"]
                and not set(self.store.names_of(a["id"])) & set(self.cfg.get("runtime", "pinned"))]
        ranked = [(row, delta_cosine(load_bitdelta(self.store.blob_path(row["sha256"])).modules, new)) for row in rows]
        return sorted(ranked, key=lambda pair: -pair[1])

    def attempt_delta(self, candidate: dict[str, Any], similarity: float, incoming: Incoming,
                      workdir: Path) -> Attempt:
        """Dense OPCM of two 1-bit deltas, streamed and re-binarised into `workdir`, then gated."""
        from zenedge.delta_merge import merge_bitdelta_files
        from zenedge.runtime.variants import load_bitdelta as load_variant

        out = workdir / "merged.bitdelta"
        stored = self.store.blob_path(candidate["sha256"])
        state = merge_bitdelta_files(stored, candidate.get("state") or {}, incoming.delta_path, out, OPCM_ALPHA)
        attempt = Attempt(candidate["id"], [], similarity, [], self.cfg.get("pool", "quality_threshold"), state,
                          merged_path=out)
        device = self.resident.device
        return self._gate(attempt, candidate, load_variant(candidate["id"], stored, device),
                          load_variant("candidate-merge", out, device), incoming,
                          load_variant("incoming", incoming.delta_path, device))

    def _gate(self, attempt: Attempt, candidate: dict[str, Any], own: Variant, merged: Variant,
              incoming: Incoming, incoming_variant: Variant) -> Attempt:
        """Measure every member of the candidate and the newcomer on the merged variant, stopping
        at the first member below the threshold (the merge is rejected then; each measurement is
        a pass over an eval set, the bulk of an arrival's cost)."""
        original = candidate["kind"] != "merged"  # its own adapter still exists: anchors can be taken
        for name in self.store.names_of(candidate["id"]):
            row = self.store.name(name)
            eval_path = self._eval_path(row)
            quality = row.get("quality") or {}
            if eval_path is not None and "own_loss" not in quality and original:
                quality = self.gate.anchors(own, eval_path)
                attempt.qualities[name] = quality
            attempt.members.append(name)
            attempt.measurements.append(self.gate.measure(name, quality, eval_path, merged, own))
            if not attempt.accepted:
                return attempt
        if incoming.eval_path is not None and "own_loss" not in incoming.quality:
            incoming.quality = self.gate.anchors(incoming_variant, incoming.eval_path)
        attempt.qualities[incoming.name] = incoming.quality
        attempt.members.append(incoming.name)
        attempt.measurements.append(self.gate.measure(incoming.name, incoming.quality, incoming.eval_path, merged,
                                                      incoming_variant))
        return attempt

    def write(self, attempt: Attempt, base: str, directory: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
        """The accepted merge as a file to store, its config, and the OPCM state to store with it."""
        if attempt.merged_path is not None:  # a 1-bit merge: already written, re-binarised
            return attempt.merged_path, {"format": "zenedge.bitdelta", "merged": "opcm"}, \
                {**attempt.state, "members": attempt.members}
        config = write_peft_adapter(attempt.state.merged, directory, base_model=base)
        state = {"method": "opcm", "alpha": OPCM_ALPHA, "lam": attempt.state.lam, "norms": list(attempt.state.norms),
                 "members": attempt.members, "energy_kept": attempt.state.truncation.energy_kept_overall,
                 "rank": config["r"]}
        return directory / "adapter_model.safetensors", config, state


    def commit(self, attempt: Attempt, base: str, workdir: Path, *, replaces: list[str], budget: int,
               max_adapters: int | None = None, newcomer=None, source: str = "merge") -> str:
        """Store an accepted merge: one transaction that adds it, re-points every member's name
        (with the quality anchors measured on the way) and deletes the adapters it replaces."""
        from zenedge.store import NewAdapter, NewName

        weights, config, state = self.write(attempt, base, workdir)
        one_bit = attempt.merged_path is not None
        merged = NewAdapter(kind="bitdelta" if one_bit else "merged", base=base, weights=weights,
                            rank=config.get("r", 0), config=config, state=state,
                            target_modules=sorted(self.store.adapter(replaces[0])["target_modules"]) if one_bit
                            else sorted(attempt.state.merged),
                            origin={"source": source, "members": attempt.members})
        names = [NewName(name=n, quality=attempt.qualities.get(n) or (self.store.name(n) or {}).get("quality") or {})
                 for n in attempt.members if newcomer is None or n != newcomer.name]
        if newcomer is not None:
            newcomer.quality = attempt.qualities.get(newcomer.name, newcomer.quality)
            names.append(newcomer)
        return self.store.put_adapter(
            merged, names, budget=budget, max_adapters=max_adapters, replaces=replaces, event="merge",
            merge={"members": json.dumps(attempt.members), "method": state.get("method", "opcm"),
                   "similarity": attempt.similarity, "retention": json.dumps(attempt.summary()["retention"])})


def manual_merge(store: Store, cfg: Config, names: list[str], method: str, *, force: bool = False,
                 engine=None) -> dict[str, Any]:
    """`zenedge merge A B --method M`: merge the adapters serving `names` by hand, gate reported
    (and enforced unless `force`), the result serving every member's name."""
    import json as _json

    from zenedge import policy
    from zenedge.errors import InvalidInput, MergeRejected
    from zenedge.merge import merge as run_method
    from zenedge.store import NewAdapter, NewName

    rows = {store.resolve(n)["id"]: store.resolve(n) for n in names}
    for row in rows.values():
        if row["kind"] not in MERGEABLE:
            raise InvalidInput(f"{row['kind']} adapters cannot be merged by hand (only LoRA and merged ones)")
    bases = {row["base"] for row in rows.values()}
    if len(bases) != 1:
        raise InvalidInput("the adapters belong to different bases")
    base = bases.pop()
    merger = PoolMerger(store, cfg, policy._resident(store, cfg, base, engine))
    adapters = [merger.factors(row) for row in rows.values()]
    cap = rank_cap(cfg, *adapters)
    result = run_method(method, adapters, max_rank=cap)
    merged_variant = merger.variant("manual-merge", result.adapter)
    members, measurements, qualities = [], [], {}
    gate = merger.gate
    for adapter_id, factors in zip(rows, adapters):
        own = merger.variant(adapter_id, factors)
        for name in store.names_of(adapter_id):
            row = store.name(name)
            eval_path = merger._eval_path(row)
            quality = row.get("quality") or {}
            if eval_path is not None and "own_loss" not in quality and rows[adapter_id]["kind"] == "lora":
                quality = qualities[name] = gate.anchors(own, eval_path)
            members.append(name)
            measurements.append(gate.measure(name, quality, eval_path, merged_variant, own))
    retention = {m.name: round(m.retention, 4) for m in measurements}
    threshold = cfg.get("pool", "quality_threshold")
    if min(retention.values()) < threshold and not force:
        raise MergeRejected(f"{method} merge keeps {retention}, below pool.quality_threshold {threshold}; "
                            "nothing was changed", hint="use --force to keep it anyway")
    with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as work:
        config = write_peft_adapter(result.adapter, Path(work), base_model=base)
        merged = NewAdapter(kind="merged", base=base, weights=Path(work) / "adapter_model.safetensors",
                            rank=config["r"], target_modules=sorted(result.adapter), config=config,
                            state={"method": method, "members": members,
                                   "energy_kept": result.truncation.energy_kept_overall, **_json_safe(result.details)},
                            origin={"source": "merge", "members": members, "method": method})
        entries = [NewName(name=n, quality=qualities.get(n) or (store.name(n) or {}).get("quality") or {})
                   for n in members]
        adapter_id = store.put_adapter(merged, entries, budget=max(cfg.budget, store.used_bytes()),
                                       replaces=list(rows), event="merge",
                                       merge={"members": _json.dumps(members), "method": method,
                                              "similarity": None, "retention": _json.dumps(retention)})
    return {"adapter_id": adapter_id, "members": members, "method": method, "retention": retention,
            "energy_kept": result.truncation.energy_kept_overall, "bytes": store.adapter(adapter_id)["bytes"]}


def _json_safe(details: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in details.items() if isinstance(v, (int, float, str, bool, list))}
