"""The quality gate: how much of each member's gain a merged adapter keeps, measured in seconds.

A member with an eval set is judged on its teacher-forced answer losses and answer tokens right on
the real base (pool/verdict.py: the retention rule and its sequential test). A profile's base and
own scores (its anchors) are measured once, while its own adapter still exists, and stored with its
name, per example, because the original adapter is gone after a merge.

Why it is fast (BENCHMARKS.md, "The pool at interactive speed"):
- Sequential: the examples of each set are read in a fixed shuffled order, ROUND at a time, until
  the verdict is known (pool/verdict.py).
- Lockstep: every member of a candidate advances together and the first clear failure ends the
  attempt; the rows of one round (all members, base/own/merged) share padded batches.
- Cheap forwards: the head runs on the answer positions only (evaluation.example_scores), the
  prompt prefix every example shares runs once per variant, and on CPUs with native bf16 the body
  runs under bf16 autocast (faster matmuls; retention barely moves).

For a member WITHOUT an eval set, a data-free proxy: on fixed generic prompts, retention =
1 − KL(p_current ‖ p_merged) / KL(p_current ‖ p_base), where p_current is the adapter serving
the member now. It measures how much of the member's departure from the base survives.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import random
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from zenedge.evaluation import (EncodedExample, EvalSetError, encode_example, example_scores, head_logits,
                                load_eval_set, right_padded_batch, shared_length, shared_prefix, supports_prefix)
from zenedge.pool.phases import Phases
from zenedge.pool.verdict import (FLOOR, MIN_EXAMPLES, Verdict, accuracy_verdict, retention, verdict,
                                  verdict_of)
from zenedge.runtime import cpu_weights, threads
from zenedge.runtime.backbone import hidden_states, prefix_states, read_prefix, right_padded
from zenedge.runtime.model import ResidentModel
from zenedge.runtime.prompts import chat_ids
from zenedge.runtime.variants import Variant

MAX_EXAMPLES = 64     # the most examples of a set the gate reads (a borderline verdict)
ROUND = 8             # examples per member per round after the first (MIN_EXAMPLES in the first)
MAX_LEN = 384
PROXY_CHUNK = 4       # generic prompts per proxy batch: two batches keep two lanes busy
SCORE_BATCH = 8         # rows per scoring batch: 6 batches for a 48-row round keep two lanes even (threads.py)
MIN_SHARED = 8        # shorter shared prefixes are not worth a separate pass
VERIFY_EXAMPLES = 2   # examples of a registry's claimed anchors re-measured (base and own) before they are used
# How far a re-measured summed answer loss may sit from the claimed one: bf16 vs fp32 scoring moves
# them by hundredths of a nat per token (most on short answers); another base or a wrong adapter
# moves them by nats.
VERIFY_SLACK, VERIFY_PER_TOKEN = 0.5, 0.05
# Registry claims checked per resident model (`QualityGate._check_claims`); weak: a dropped base takes its entries.
_CONFIRMED: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, bool]]" = weakref.WeakKeyDictionary()
# The base's log-probs on GENERIC_PROMPTS per resident model (`QualityGate._log_probs`): about 18 MB.
_BASE_LOG_PROBS: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()
GENERIC_PROMPTS = [
    "Tell me about your day.", "What is the capital of Italy?", "Write one sentence about rain.",
    "How do I boil an egg?", "List three colours.", "Explain what a computer is.",
    "What is 12 plus 30?", "Describe a cat in five words.",
]


@dataclass
class Measurement:
    name: str
    metric: str              # "loss" | "accuracy" (which kept gain decided) | "proxy"
    retention: float
    merged_loss: float | None = None
    examples: int = 0        # eval examples read (0 for the proxy)
    passed: bool | None = None


@dataclass
class Member:
    """A profile the merged adapter would serve. `current`: the adapter serving it now (the variant
    `original` says is its own adapter, whose losses can still be measured as anchors)."""

    name: str
    eval_path: Path | None
    quality: dict[str, Any]
    current: Variant | None
    original: bool


@dataclass
class GateResult:
    measurements: list[Measurement]
    anchors: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> quality to store
    # name -> what was read (an eval set's rows, or a proxy's measurement), to resume (check's `resume`)
    reads: dict[str, "_Set | Measurement"] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.measurements) and all(m.passed for m in self.measurements)


@dataclass
class _Set:
    """One member's eval set in the gate's fixed order, with the per-example sums read so far."""

    member: Member
    examples: list[EncodedExample]
    population: int
    base: list[float]
    own: list[float]
    merged: list[float] = field(default_factory=list)
    order: str = ""
    legacy: bool = False   # anchors from before per-example storage: means only, read the whole set
    base_hits: list[int] = field(default_factory=list)    # answer tokens right (teacher-forced argmax)
    own_hits: list[int] = field(default_factory=list)
    merged_hits: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return [len(e.answer_ids) for e in self.examples]


class QualityGate:
    def __init__(self, resident: ResidentModel, batch_size: int = SCORE_BATCH):
        self.resident = resident
        self.batch_size = batch_size
        self._encoded: dict[str, tuple[str, list[EncodedExample]]] = {}

    # -- scoring -----------------------------------------------------------------------------
    @property
    def scorer(self) -> str:
        """What the losses were computed on; stored with anchors (for diagnosis)."""
        dtype = "bfloat16" if self._autocast else str(self.resident.dtype).replace("torch.", "")
        x8 = "-x8" if cpu_weights.rounds_inputs_to_int8(self.resident.weights) else ""
        return f"{self.resident.device.type}-{dtype}{x8}"

    @property
    def _autocast(self) -> bool:
        return (self.resident.device.type == "cpu" and self.resident.dtype == torch.float32
                and cpu_weights.onednn_bf16_available())

    def _precision(self):
        if self._autocast:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def encoded(self, eval_path: Path) -> tuple[str, list[EncodedExample]]:
        """The set's examples in the gate's fixed order (a shuffle seeded by the file's digest, so
        anchors stored per example line up with later reads), and that digest."""
        key = str(eval_path)
        if key not in self._encoded:
            examples = load_eval_set(eval_path)
            digest = hashlib.sha256(Path(eval_path).read_bytes()).hexdigest()[:16]
            random.Random(int(digest, 16)).shuffle(examples)
            encoded = []
            for example in examples:
                try:
                    encoded.append(encode_example(self.resident.tokenizer, example, MAX_LEN))
                except EvalSetError:
                    continue  # a prompt longer than MAX_LEN: the rest of the set still counts
                if len(encoded) == MAX_EXAMPLES:
                    break
            if not encoded:
                raise EvalSetError(f"{eval_path}: no example fits {MAX_LEN} tokens")
            self._encoded[key] = digest, encoded
        return self._encoded[key]

    def score(self, rows: Sequence[tuple[Variant | None, EncodedExample]]) -> list[tuple[float, int]]:
        """Summed answer loss and answer tokens right of each (variant, example) row; rows of any variants share batches
        (sorted by length: little padding; the runtime applies each row's variant), which run on
        lanes (threads.map_lanes: one per free core, none waiting on another). The tokens every row
        of a batch shares (the chat template's system turn) run once per variant, their keys and
        values reused by each row: a quarter to a half of a short example's tokens."""
        model = self.resident.model
        pad = self.resident.tokenizer.pad_token_id or 0
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][1].prompt_ids) + len(rows[i][1].answer_ids))
        chunks = [order[start:start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        plans = []                            # per chunk: its variants, examples and shared prefix
        for chunk in chunks:
            variants, examples = [rows[i][0] for i in chunk], [rows[i][1] for i in chunk]
            skip = shared_prefix(examples) if supports_prefix(model) else 0
            skip = skip if skip >= MIN_SHARED else 0
            plans.append((variants, examples, tuple(examples[0].prompt_ids[:skip]) if skip else None))
        states: dict[tuple[str | None, tuple[int, ...]], list] = {}
        for variants, _, ids in plans:       # computed before the lanes start: they only read them
            for variant in variants if ids else ():
                key = (variant.key if variant else None, ids)
                if key not in states:
                    with self.resident.state.using([variant], plain=True), self._precision():
                        states[key] = prefix_states(model, ids)

        def run(plan) -> tuple[torch.Tensor, torch.Tensor]:
            variants, examples, ids = plan
            prefix = [states[(v.key if v else None, ids)] for v in variants] if ids else None
            batch = right_padded_batch(examples, pad, len(ids) if ids else 0)
            # Teacher-forced scoring reads text like a prefill: on the plain weights (runtime/layers.py).
            with self.resident.state.using(variants, plain=True), self._precision():
                return example_scores(model, batch, prefix)

        sums: list[tuple[float, int]] = [(0.0, 0)] * len(rows)
        scored = threads.map_lanes(run, plans[::-1])[::-1]   # longest first: the lanes finish together
        for chunk, (losses, hits) in zip(chunks, scored):
            for i, loss, hit in zip(chunk, losses.tolist(), hits.tolist()):
                sums[i] = (loss, hit)
        return sums

    # -- the gate ----------------------------------------------------------------------------
    def check(self, members: Sequence[Member], merged: Variant, threshold: float,
              phases: Phases | None = None, *, stop_at_failure: bool = True,
              resume: dict[str, "_Set | Measurement"] | None = None) -> GateResult:
        """Measure every member on the merged variant, in lockstep rounds, until each has a verdict
        or one fails (the merge is rejected then and the rest is not read, unless
        `stop_at_failure` is False: a forced manual merge reports every member). `resume`: the
        `reads` of an earlier check of the same merged variant, continued rather than read again."""
        phases = phases or Phases()
        result = GateResult([])
        sets: list[_Set] = []
        resume = resume or {}
        self._check_claims([m for m in members if m.name not in resume], phases)
        for member in members:
            if member.name in resume:
                earlier = resume[member.name]
                if isinstance(earlier, _Set):
                    sets.append(earlier)
                    continue
                result.measurements.append(earlier)      # a proxy's verdict is whole: not read again
                if not earlier.passed and stop_at_failure:
                    return result
                continue
            try:
                prepared = self._prepare(member, phases)
            except EvalSetError as exc:  # a broken stored set must not block merges: judge by the proxy
                phases.note(f"{member.name}: eval set unusable ({exc}); using the data-free proxy", "gate",
                            member=member.name)
                prepared = None
            if prepared is None:  # no eval set (or no anchors for it): the data-free proxy
                with phases.phase("gate", f"checking quality of {member.name} (proxy)", member=member.name) as rec:
                    value = self.proxy(member.current, merged)
                    rec["retention"] = round(value, 4)
                result.measurements.append(Measurement(member.name, "proxy", value, passed=value >= threshold))
                result.reads[member.name] = result.measurements[-1]
                if value < threshold and stop_at_failure:
                    return result
            else:
                sets.append(prepared)
        result.reads.update({s.member.name: s for s in sets})
        open_sets = self._settle(sets, threshold, result, stop_at_failure)  # resumed sets may be decided already
        while open_sets:
            rows_needed = {id(s): len(s.merged) + (MIN_EXAMPLES if not s.merged else ROUND) for s in open_sets}
            self._anchor_round(open_sets, rows_needed, phases)
            self._merged_round(open_sets, rows_needed, merged, phases)
            open_sets = self._settle(open_sets, threshold, result, stop_at_failure)
        result.anchors = self._anchors(sets)
        return result

    def _settle(self, sets: list[_Set], threshold: float, result: GateResult, stop_at_failure: bool) -> list[_Set]:
        """Record the verdict of every set that has one (a set not read yet has none); returns the
        sets still undecided, or none when a failure ends the check."""
        still = []
        for s in sets:
            decision, metric = self._decide(s, threshold)
            if not decision.decided:
                still.append(s)
                continue
            merged_loss = sum(s.merged) / max(1, sum(s.tokens[:len(s.merged)]))
            result.measurements.append(Measurement(s.member.name, metric, decision.retention, merged_loss,
                                                   decision.examples, decision.passed))
            if not decision.passed and stop_at_failure:
                return []
        return still

    def _prepare(self, member: Member, phases: Phases) -> _Set | None:
        if member.eval_path is None:
            return None
        quality = member.quality or {}
        per_example = quality.get("per_example")
        digest, examples = self.encoded(member.eval_path)
        claim = self._claim(member)
        if claim is not None:
            self._check_claims([member], phases)  # a no-op where `check` did it for every member at once
            if not self._confirmed()[claim]:
                per_example = None  # the registry's anchors are not this base's numbers: measure them here
        elif member.original and quality.get("scorer", self.scorer) != self.scorer:
            per_example = None  # measured another way (runtime.activations changed since): measure them again
        if per_example and per_example.get("order") == digest:
            known = len(per_example["base"])
            population = len(examples) if member.original else known
            hits = "own_hits" in per_example  # older anchors have losses only (then loss alone decides)
            if member.original and not hits:  # measurable again: start over with both
                return _Set(member, examples, len(examples), [], [], order=digest)
            return _Set(member, examples[:population], population, list(per_example["base"]),
                        list(per_example["own"]), order=digest,
                        base_hits=list(per_example.get("base_hits", [])), own_hits=list(per_example.get("own_hits", [])))
        if member.original:  # anchors to measure as the gate reads
            return _Set(member, examples, len(examples), [], [], order=digest)
        if quality.get("metric") == "loss" and "own_loss" in quality:
            # Means stored by an older gate: read the whole set, compare means.
            count = min(len(examples), int(quality.get("examples") or len(examples)))
            return _Set(member, examples[:count], count, [], [], order=digest, legacy=True)
        return None

    def _claim(self, member: Member) -> tuple | None:
        """What identifies a registry's claimed anchors for `member` (its eval set's order, the adapter
        serving it, the claimed numbers re-measured), or None when it has no claim to check. The
        adapter is its variant's key: the pool keys variants by content (a stored adapter's id, a
        newcomer's file hash), so a claim checked for one adapter is never taken for another's."""
        per_example = (member.quality or {}).get("per_example")
        if not (member.original and member.eval_path is not None and per_example and member.quality.get("claimed")):
            return None
        digest, examples = self.encoded(member.eval_path)
        if per_example.get("order") != digest:
            return None
        count = min(VERIFY_EXAMPLES, len(examples), len(per_example["base"]))
        return (digest, member.current.key if member.current else None,
                tuple(per_example["base"][:count]), tuple(per_example["own"][:count]))

    def _confirmed(self) -> dict[tuple, bool]:
        """Claims checked on this resident model, by `_claim`: a pull's later attempts, and a daemon's
        later pulls, do not check the same claim again."""
        return _CONFIRMED.setdefault(self.resident.model, {})

    def _check_claims(self, members: Sequence[Member], phases: Phases) -> None:
        """Re-measure the first VERIFY_EXAMPLES of every member's claimed anchors (base and own), all
        in one batch: a registry is untrusted, and anchors from another base or scorer would skew
        every verdict."""
        confirmed = self._confirmed()
        todo = {}
        for member in members:
            try:
                claim = self._claim(member)
            except EvalSetError:
                continue  # `_prepare` meets it again, and falls back to the proxy
            if claim is not None and claim not in confirmed:
                todo[claim] = member
        if not todo:
            return
        rows = []
        for claim, member in todo.items():
            examples = self.encoded(member.eval_path)[1]
            rows += [(variant, examples[i]) for i in range(len(claim[2])) for variant in (None, member.current)]
        names = [member.name for member in todo.values()]
        with phases.phase("anchors", f"checking the registry's measurements of {', '.join(names)}",
                          members=names) as rec:
            values = iter(self.score(rows))
            rec["rows"] = len(rows)
        for claim, member in todo.items():
            examples = self.encoded(member.eval_path)[1]
            confirmed[claim] = True
            for i, (claimed_base, claimed_own) in enumerate(zip(claim[2], claim[3])):
                tolerance = VERIFY_SLACK + VERIFY_PER_TOKEN * len(examples[i].answer_ids)
                (base, _), (own, _) = next(values), next(values)
                if abs(base - claimed_base) > tolerance or abs(own - claimed_own) > tolerance:
                    confirmed[claim] = False
            if not confirmed[claim]:
                phases.note(f"{member.name}: the registry's measurements do not match this base; measuring them",
                            "anchors", member=member.name)

    def measure_anchors(self, name: str, eval_path: Path, own: Variant, phases: Phases | None = None) -> dict[str, Any]:
        """A profile's anchors on every example the gate may read (what a registry publishes)."""
        phases = phases or Phases()
        prepared = self._prepare(Member(name, eval_path, {}, own, True), phases)
        if prepared is None:
            raise EvalSetError(f"{eval_path}: no examples to measure")
        self._anchor_round([prepared], {id(prepared): prepared.population}, phases)
        quality = self._anchors([prepared])[name]
        return {"scorer": quality["scorer"], **quality["per_example"]}

    def _anchor_round(self, sets: list[_Set], needed: dict[int, int], phases: Phases) -> None:
        rows, where = [], []
        for s in sets:
            if s.legacy:
                continue
            upto = min(needed[id(s)], s.population)
            for i in range(len(s.base), upto):
                rows.append((None, s.examples[i]))
                where.append((s.base, s.base_hits))
            for i in range(len(s.own), upto):
                rows.append((s.member.current, s.examples[i]))
                where.append((s.own, s.own_hits))
        if not rows:
            return
        names = sorted({s.member.name for s in sets if not s.legacy and len(s.own) < min(needed[id(s)], s.population)})
        with phases.phase("anchors", f"measuring {', '.join(names)} on their own (base and adapter)",
                          members=names) as rec:
            values = self.score(rows)
            rec["rows"] = len(rows)
        for (losses, hits), (loss, hit) in zip(where, values):  # rows were listed in example order per target
            losses.append(loss)
            hits.append(hit)

    def _merged_round(self, sets: list[_Set], needed: dict[int, int], merged: Variant, phases: Phases) -> None:
        rows, owners = [], []
        for s in sets:
            upto = min(needed[id(s)], s.population)
            for i in range(len(s.merged), upto):
                rows.append((merged, s.examples[i]))
                owners.append(s)
        names = [s.member.name for s in sets]
        with phases.phase("gate", f"checking quality of {', '.join(names)}", members=names) as rec:
            values = self.score(rows)
            rec["rows"] = len(rows)
        for s, (loss, hits) in zip(owners, values):
            s.merged.append(loss)
            s.merged_hits.append(hits)

    @staticmethod
    def _decide(s: _Set, threshold: float) -> tuple[Verdict, str]:
        n = len(s.merged)
        if s.legacy:
            if n < s.population:
                return Verdict(False, False, 0.0, n), "loss"
            quality = s.member.quality
            value = retention(quality["base_loss"], quality["own_loss"], sum(s.merged) / max(1, sum(s.tokens)))
            value = value if math.isfinite(value) else 0.0
            return Verdict(True, value >= threshold, value, n), "loss"
        loss = verdict(s.base, s.own, s.merged, s.tokens, threshold, s.population)
        if len(s.own_hits) < n:  # anchors stored before token accuracy was kept: loss alone
            return loss, "loss"
        accuracy = accuracy_verdict(s.base_hits, s.own_hits, s.merged_hits, s.tokens, threshold, s.population)
        if accuracy is None:
            return loss, "loss"
        floor = min(FLOOR, threshold)
        floors = ((verdict(s.base, s.own, s.merged, s.tokens, floor, s.population), "loss"),
                  (accuracy_verdict(s.base_hits, s.own_hits, s.merged_hits, s.tokens, floor, s.population), "accuracy"))
        return verdict_of(loss, accuracy, floors)

    def _anchors(self, sets: list[_Set]) -> dict[str, dict[str, Any]]:
        """The per-example anchors of members measured on their own adapter (to store with them)."""
        out = {}
        for s in sets:
            if s.legacy or not s.member.original:
                continue
            n = min(len(s.base), len(s.own))
            count = max(1, sum(s.tokens[:n]))
            out[s.member.name] = {
                "metric": "loss", "base_loss": sum(s.base[:n]) / count, "own_loss": sum(s.own[:n]) / count,
                "examples": n, "scorer": self.scorer,
                "per_example": {"order": s.order, "base": [round(v, 5) for v in s.base[:n]],
                                "own": [round(v, 5) for v in s.own[:n]],
                                "base_hits": s.base_hits[:n], "own_hits": s.own_hits[:n]},
            }
        return out

    # -- the data-free proxy -------------------------------------------------------------------
    def _log_probs(self, variant: Variant | None) -> tuple[torch.Tensor, torch.Tensor]:
        """log p at every position of the generic prompts under `variant` ([N, V]), and how many
        prompts each position stands for ([N]). The base's are read once per resident model: every
        proxy compares with them (again after `runtime.activations` changed: a reload)."""
        rounding = cpu_weights.rounds_inputs_to_int8(self.resident.weights)
        cached = _BASE_LOG_PROBS.get(self.resident.model)
        if variant is None and cached is not None and cached[0] == rounding:
            return cached[1]
        rows = [chat_ids(self.resident.tokenizer, [{"role": "user", "content": p}]) for p in GENERIC_PROMPTS]
        skip = shared_length(rows)
        if supports_prefix(self.resident.model) and skip >= MIN_SHARED:
            read = self._read_after_prefix(variant, rows, skip)
        else:
            read = self._read_whole(variant, rows)
        if variant is None:
            _BASE_LOG_PROBS[self.resident.model] = rounding, read
        return read

    def _read_whole(self, variant: Variant | None, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        model, device = self.resident.model, self.resident.device

        def run(ids: list[int]) -> torch.Tensor:   # on a lane (threads.map_lanes): grad mode is per thread
            with torch.no_grad(), self.resident.state.using([variant], plain=True):
                logits = model(input_ids=torch.tensor([ids], device=device)).logits
            return torch.log_softmax(logits[0].float(), dim=-1)
        log_probs = torch.cat(threads.map_lanes(run, rows))
        return log_probs, torch.ones(len(log_probs), device=log_probs.device)

    def _read_after_prefix(self, variant: Variant | None, rows: list[list[int]], skip: int
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens every prompt starts with (the chat template's system turn and user header,
        about two thirds of them) read once and weighted by the number of prompts, then the rest of
        each prompt after them: the same mean as reading every prompt whole, in a third of the tokens."""
        model, device = self.resident.model, self.resident.device
        pad = self.resident.tokenizer.pad_token_id or 0
        with torch.no_grad(), self.resident.state.using([variant], plain=True):
            shared, states = read_prefix(model, rows[0][:skip])

        def run(chunk: list[list[int]]) -> torch.Tensor:   # on a lane: grad mode is per thread
            ids, mask = (t.to(device) for t in right_padded([row[skip:] for row in chunk], pad))
            with torch.no_grad(), self.resident.state.using([variant], plain=True):
                hidden = hidden_states(model, ids, mask, [states] * len(chunk))
            return hidden[mask.bool()]                  # the real tokens, row after row
        chunks = [rows[i:i + PROXY_CHUNK] for i in range(0, len(rows), PROXY_CHUNK)]
        hidden = torch.cat([shared, *threads.map_lanes(run, chunks)])
        with torch.no_grad():
            log_probs = torch.log_softmax(head_logits(model, hidden), dim=-1)
        weights = torch.ones(len(hidden), device=hidden.device)
        weights[:skip] = len(rows)
        return log_probs, weights

    def proxy(self, current: Variant | None, merged: Variant) -> float:
        p, weights = self._log_probs(current)
        kl = lambda q: float(((p.exp() * (p - q)).sum(-1) * weights).sum() / weights.sum())
        drift = kl(self._log_probs(None)[0])
        if drift < 1e-6:
            return 1.0
        return max(0.0, 1.0 - kl(self._log_probs(merged)[0]) / drift)


def claimed_quality(anchors: dict[str, Any]) -> dict[str, Any]:
    """A registry's published anchors as a name's stored quality, marked as claimed until the gate
    has re-measured some of them (`QualityGate._confirms`)."""
    per_example = {key: anchors[key] for key in ("order", "base", "own", "base_hits", "own_hits")}
    return {"metric": "loss", "claimed": True, "scorer": anchors.get("scorer", ""),
            "examples": len(per_example["base"]), "per_example": per_example}
