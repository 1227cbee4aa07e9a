"""What a pool operation is doing, as it does it: progress events for the user, and a time
profile of the same phases for the benchmarks.

One `Phases` object follows one operation (an import, a pull's commit, a maintenance pass). Each
phase sends a progress event when it starts (`{"status": "checking quality of writer", "phase":
"gate", ...}`: the CLI prints the status line, `--json` and the daemon's NDJSON stream carry the
dict) and records its wall time when it ends. Phases:

  base     converting the embedded default base into the store (first use only; progress lines)
  load     loading the base's weights for the gate (a CLI process; the daemon's engine has them)
  compress storing an adapter in a smaller format (shrink.py), before it is gated
  rank     similarity of the newcomer to every stored adapter (low rank, no forward pass)
  fold     the merge itself: low-rank OPCM of the newcomer into one candidate
  anchors  a profile's base and own losses on its eval set (forward passes; measured once)
  gate     the merged adapter's losses on its members' eval sets (forward passes)
  commit   writing the result: one SQLite transaction and an atomic rename
  evict    removing adapters to make room
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

Progress = Callable[[dict[str, Any]], None]
PHASES = ("load", "compress", "rank", "fold", "anchors", "gate", "commit", "evict")


@dataclass
class Phases:
    progress: Progress | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    open: str | None = None  # the phase being timed: phases never nest, so their seconds add up

    @contextmanager
    def phase(self, phase: str, status: str, **detail: Any) -> Iterator[dict[str, Any]]:
        """Report `status` now; on exit record the phase's seconds. The yielded dict takes details
        known only at the end (e.g. how many examples a gate pass read)."""
        if self.open is not None:
            raise RuntimeError(f"phase {phase!r} started inside {self.open!r}: its time would count twice")
        if self.progress is not None:
            self.progress({"status": status, "phase": phase, **detail})
        record = {"phase": phase, **detail}
        start = time.perf_counter()
        self.open = phase
        try:
            yield record
        finally:
            self.open = None
            record["seconds"] = round(time.perf_counter() - start, 3)
            self.records.append(record)

    @contextmanager
    def attempt(self, phase: str, status: str, **detail: Any) -> Iterator[None]:
        """A phase that may be refused (storing without a merge, when the budget may not allow it):
        reported and recorded only if it succeeds."""
        start = time.perf_counter()
        yield
        if self.progress is not None:
            self.progress({"status": status, "phase": phase, **detail})
        self.records.append({"phase": phase, **detail, "seconds": round(time.perf_counter() - start, 3)})

    def note(self, status: str, phase: str, **detail: Any) -> None:
        """A progress line without a timed phase (e.g. which candidate was chosen)."""
        if self.progress is not None:
            self.progress({"status": status, "phase": phase, **detail})

    def profile(self) -> dict[str, Any]:
        """Where the operation's time went: seconds per phase kind, and every phase in order."""
        by_phase = {name: 0.0 for name in PHASES}
        for record in self.records:
            by_phase[record["phase"]] = by_phase.get(record["phase"], 0.0) + record["seconds"]
        return {"total_seconds": round(time.perf_counter() - self.started, 3),
                "by_phase": {k: round(v, 3) for k, v in by_phase.items()}, "phases": list(self.records)}
