"""What the pool reports after admitting a profile: the typed results its callers read by field.

`as_dict()` gives each one's JSON form, the one the CLI prints (`--json`) and the daemon sends:
it holds only the fields the action has (a stored profile has no merge partner, no eviction).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class AttemptSummary:
    """One merge the quality gate judged: into which stored adapter, and what each member kept."""

    candidate: str                 # the stored adapter's id, first 12 hex digits
    members: list[str]
    similarity: float
    retention: dict[str, float]    # per profile, the share of its gain the merge keeps
    examples: dict[str, int]       # per profile, eval examples read (a proxy-scored one is absent)
    accepted: bool
    lost_gain: float | None = None       # least-loss admission: the gains the refused merge loses
    eviction_loses: int | None = None    # … against the profiles evicting instead would lose

    def as_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class ShrinkStep:
    """One adapter the pool tried to store in a smaller format to make room (shrink.py)."""

    names: list[str]
    stored_as: str                 # its format before: fp32, fp16, bf16, int8
    compressed_to: str             # bf16, int8 or int4
    retention: dict[str, float]
    freed_bytes: int
    kept: bool                     # False: a profile kept less than pool.compress_threshold; nothing changed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Admitted:
    """A profile stored in the pool: as it came, merged into a similar one, or after evictions."""

    name: str
    adapter_id: str
    kind: str
    bytes: int
    action: str                    # "stored", "merged" or "evicted"
    merged_with: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    attempts: list[AttemptSummary] = field(default_factory=list)
    compressed: list[ShrinkStep] = field(default_factory=list)   # stored smaller first to make room
    profile: dict[str, Any] = field(default_factory=dict)         # where the time went (phases.py)
    below_threshold: bool = False  # least-loss admission kept a merge the gate refused
    lost_gain: float | None = None
    eviction_would_lose: int | None = None

    def as_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"name": self.name, "adapter_id": self.adapter_id, "kind": self.kind,
                                 "bytes": self.bytes, "action": self.action}
        if self.action == "merged":
            shown["merged_with"] = self.merged_with
        if self.action == "evicted":
            shown["evicted"] = self.evicted
        if self.action != "stored":
            shown["attempts"] = [a.as_dict() for a in self.attempts]
        if self.below_threshold:
            shown.update(below_threshold=True, lost_gain=self.lost_gain, eviction_would_lose=self.eviction_would_lose)
        return {**shown, "compressed": [s.as_dict() for s in self.compressed], "profile": self.profile}


@dataclass(frozen=True)
class Pulled:
    """A pulled profile: what the pool holds for it now, and how it was admitted (None: it was up
    to date, nothing was stored)."""

    name: str
    version: str
    kind: str
    bytes: int
    adapter_id: str
    admitted: Admitted | None = None

    @property
    def up_to_date(self) -> bool:
        return self.admitted is None

    def as_dict(self) -> dict[str, Any]:
        shown = {"name": self.name, "version": self.version, "kind": self.kind, "bytes": self.bytes,
                 "adapter_id": self.adapter_id, "up_to_date": self.up_to_date}
        if self.admitted:
            details = self.admitted.as_dict()
            shown["policy"] = self.admitted.action
            shown.update({key: details[key] for key in POLICY_DETAILS if details.get(key)})
        return shown


# What a pull's JSON repeats of its admission, when there is something to say.
POLICY_DETAILS = ("merged_with", "evicted", "attempts", "compressed", "profile")
