"""`zenedge bench merge` (or `python -m zenedge.bench merge`): the K-Merge proof on the real
profiles of the default base.

For 3 arrival orders and K ∈ {2, 3, 4, 5} slots, every LoRA profile of the registry arrives in
turn; after the last arrival each profile is scored on its own eval set with whatever serves it:

  zenedge@T       the product itself: a fresh pool with pool.max_adapters = K and
                  pool.quality_threshold = T, profiles imported through the real pool
                  (similarity → low-rank OPCM → quality gate → merge, else evict). An evicted
                  profile is served by the base. The gate sees its own slice of each eval set
                  (the examples after the scored ones), never the examples that are scored.
  kmerge          K-Merge as published: argmax-similarity slot, PEFT factor-space running average
                  with weights [1 − 1/n, 1/n] (merge method `kmerge-linear`).
  ties, dare      the same slot choice, merged with TIES / DARE (weights [1 − 1/n, 1/n]).
  random          a random slot, running average (`kmerge-linear`).

Normalised score per profile (K-Merge's metric): exact-match accuracy of the serving adapter ÷
that of the profile's own adapter where the profile has checkable answers, loss retention
(L_base − L)/(L_base − L_own) otherwise; S = mean over profiles. Also integration time per
arrival and the process's peak memory.
"""

from __future__ import annotations

import hashlib
import json
import random
import resource
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zenedge.sizes import format_size

METHODS = ("zenedge", "kmerge", "ties", "dare", "random")


@dataclass
class Profile:
    name: str
    adapter_dir: Path
    eval_path: Path
    metric: str
    factors: dict
    encoded: list = field(default_factory=list)
    gate_eval_path: Path | None = None
    base: dict = field(default_factory=dict)
    own: dict = field(default_factory=dict)


def load_profiles(root: Path, examples: int) -> list[Profile]:
    from zenedge.adapters.lora_tensors import read_lora_factors

    profiles = []
    for folder in sorted(p for p in root.iterdir() if (p / "adapter" / "adapter_config.json").is_file()):
        recipe = json.loads((folder / "recipe.json").read_text()) if (folder / "recipe.json").is_file() else {}
        config = json.loads((folder / "adapter" / "adapter_config.json").read_text())
        factors = read_lora_factors(folder / "adapter" / "adapter_model.safetensors", config, dtype=torch.float32)
        profiles.append(Profile(recipe.get("name", folder.name), folder / "adapter", folder / "eval.jsonl",
                                recipe.get("metric", "loss"), factors))
    return profiles


class Scorer:
    """Loss and exact match of a variant on a profile's eval set, cached by adapter content.

    Exact match decodes through the runtime's own generate (KV cache, the serving path), not
    `bench.exact_match.exact_match`, which re-runs the whole sequence per token so it works on any
    Hugging Face model: the same answers on these sets, much slower."""

    def __init__(self, resident, examples: int):
        self.resident = resident
        self.examples = examples
        self._cache: dict[tuple[str, str], dict] = {}

    def prepare(self, profile: Profile) -> None:
        from zenedge.evaluation import encode_examples, load_eval_set

        profile.encoded = encode_examples(self.resident.tokenizer, load_eval_set(profile.eval_path)[: self.examples],
                                          384)

    def score(self, profile: Profile, variant, key: str) -> dict:
        cache_key = (profile.name, key)
        if cache_key not in self._cache:
            from zenedge.evaluation import answer_loss

            pad = self.resident.tokenizer.pad_token_id or 0
            with self.resident.state.using([variant], plain=True):   # as the gate scores
                loss = answer_loss(self.resident.model, profile.encoded, 16, pad)
            result = {"loss": loss}
            if profile.metric == "exact_match":
                result["accuracy"] = self._accuracy(profile, variant)
            self._cache[cache_key] = result
        return self._cache[cache_key]

    def _accuracy(self, profile: Profile, variant) -> float:
        from zenedge.bench.exact_match import normalize_whitespace
        from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate

        examples = profile.encoded
        params = SamplingParams(max_tokens=max(len(e.answer_ids) for e in examples) + 8)
        hits = 0
        for start in range(0, len(examples), 16):
            chunk = examples[start:start + 16]
            requests = [GenerationRequest(list(e.prompt_ids), variant, params) for e in chunk]
            texts = [""] * len(chunk)
            for deltas in generate(self.resident, requests):
                for d in deltas:
                    texts[d.index] += d.text
            hits += sum(normalize_whitespace(t) == normalize_whitespace(e.answer) for t, e in zip(texts, chunk))
        return hits / len(examples)


def normalised(profile: Profile, served: dict) -> float:
    from zenedge.pool.verdict import retention

    if profile.metric == "exact_match" and profile.own.get("accuracy", 0) > 0:
        return served["accuracy"] / profile.own["accuracy"]
    return retention(profile.base["loss"], profile.own["loss"], served["loss"])


def clipped_mean(scores: dict[str, float]) -> float:
    """S with each profile's score clipped to [0, 1]: a profile served worse than the base counts
    as lost (not as minus its gain), and beating its own adapter on a small eval set (exact match
    on 16 examples moves in steps of 1/16) does not make up for another profile's loss."""
    return sum(min(max(v, 0.0), 1.0) for v in scores.values()) / len(scores)


def content_key(factors: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(factors):
        digest.update(name.encode())
        digest.update(factors[name].A.numpy().tobytes())
        digest.update(factors[name].B.numpy().tobytes())
    return digest.hexdigest()[:16]


def simulate(method: str, order: list[Profile], slots: int, seed: int) -> tuple[dict[str, dict | None], list[float]]:
    """The in-memory baselines: profile name → factors serving it, and seconds per arrival."""
    from zenedge.merge import lora_cosine, merge

    rng = random.Random(seed)
    pool: list[dict] = []  # {"factors", "members"}
    times = []
    for profile in order:
        start = time.perf_counter()
        if len(pool) < slots:
            pool.append({"factors": profile.factors, "members": [profile.name]})
        else:
            if method == "random":
                target = rng.randrange(len(pool))
            else:
                target = max(range(len(pool)), key=lambda i: lora_cosine(profile.factors, pool[i]["factors"]))
            slot = pool[target]
            n = len(slot["members"]) + 1
            if method in ("kmerge", "random"):
                result = merge("kmerge-linear", [slot["factors"], profile.factors], members_after=n)
            else:
                options = {"seed": seed} if method == "dare" else {}
                result = merge(method, [slot["factors"], profile.factors], weights=[1 - 1 / n, 1 / n], **options)
            slot["factors"] = result.adapter
            slot["members"].append(profile.name)
        times.append(time.perf_counter() - start)
    serving = {m: slot["factors"] for slot in pool for m in slot["members"]}
    return serving, times


def integration_seconds(profiles: list[Profile], alpha: float = 0.5) -> dict[str, float]:
    """The merge itself, without the gate: for each profile arriving into a pool of all the others,
    rank the pool by similarity and fold the profile into the best one with low-rank OPCM
    (rank cap = the larger member's, the default `merge_rank`)."""
    from zenedge.merge import lowrank_opcm_init, lowrank_opcm_step, rank_by_similarity

    seconds = []
    for profile in profiles:
        pool = {p.name: p.factors for p in profiles if p is not profile}
        start = time.perf_counter()
        best, _ = rank_by_similarity(profile.factors, pool)[0]
        cap = max(f.rank for a in (pool[best], profile.factors) for f in a.values())
        lowrank_opcm_step(lowrank_opcm_init(pool[best], cap), profile.factors, alpha, cap)
        seconds.append(time.perf_counter() - start)
    return {"mean": sum(seconds) / len(seconds), "max": max(seconds), "pool_size": len(profiles) - 1}


def write_gate_slices(profiles: list[Profile], scored: int, gate_examples: int, directory: Path) -> None:
    """Give each profile a gate eval file disjoint from the examples the benchmark scores."""
    from zenedge.evaluation import load_eval_set

    for profile in profiles:
        held_out = load_eval_set(profile.eval_path)[scored:scored + gate_examples]
        if not held_out:
            raise ValueError(f"{profile.eval_path}: no examples left for the gate after the {scored} scored ones")
        path = directory / f"{profile.name}.gate.jsonl"
        path.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in held_out))
        profile.gate_eval_path = path


@dataclass(frozen=True)
class Limit:
    """What a zenedge row's pool is held to: K slots (the budget roomy, compression off: K-Merge's
    setting), or a byte budget of `units` bf16 r=8 adapters with no slot limit, merging only or
    compressing first."""

    slots: int | None = None
    budget: int | None = None
    units: int | None = None
    compress: bool = False

    @property
    def pool_settings(self) -> str:
        if self.budget is None:
            return f'max_adapters = {self.slots}\ncompress_to = "off"\n'
        return (f'max_adapters = 1000\nbudget = "{self.budget}B"\n'
                f'compress_to = "{"int4" if self.compress else "off"}"\n')

    @property
    def label(self) -> str:
        return "" if self.budget is None else (" compress" if self.compress else " merge-only")


def run_zenedge(order: list[Profile], limit: Limit, base_dir: Path, threshold: float) -> tuple[dict, list[float], list]:
    """The real product: a fresh pool, the real admission, the real gate."""
    from zenedge import bases, config
    from zenedge.pool import import_lora
    from zenedge.runtime.engine import Engine
    from zenedge.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cfg_path = tmp / "config.toml"
        cfg_path.write_text(f'[pool]\n{limit.pool_settings}quality_threshold = {threshold}\n'
                            '[runtime]\ndevice = "cpu"\ndtype = "float32"\n')
        cfg = config.load(cfg_path)
        store = Store(tmp / "home")
        bases.add_hf_dir(store, base_dir, bases.DEFAULT_BASE, aliases=bases.DEFAULT_BASE_ALIASES,
                         sha256=bases.DEFAULT_BASE_SHA256)
        engine = Engine(store, cfg)
        times, actions = [], []
        for profile in order:
            start = time.perf_counter()
            result = import_lora(store, cfg, profile.adapter_dir, profile.name,
                                 eval_path=profile.gate_eval_path or profile.eval_path, engine=engine).as_dict()
            times.append(time.perf_counter() - start)
            actions.append({"name": profile.name, "action": result.get("action"),
                            "merged_with": result.get("merged_with"), "evicted": result.get("evicted"),
                            "attempts": result.get("attempts", []), "compressed": result.get("compressed", []),
                            "used_bytes": store.used_bytes()})
        serving = {}
        for profile in order:
            row = store.name(profile.name)
            if row is None:
                serving[profile.name] = None
                continue
            adapter = store.adapter(row["adapter_id"])
            variant = engine._load_variant(adapter)
            serving[profile.name] = (adapter["id"][:16], variant)
        return serving, times, actions


def bf16_adapter_bytes(profiles: list[Profile]) -> int:
    """The size of one profile's adapter stored in bf16 (the unit of `--budget-bytes`): the largest
    over the profiles, for r = 8 adapters of one base all the same."""
    from zenedge.adapters.lora_tensors import write_peft_adapter

    sizes = []
    with tempfile.TemporaryDirectory() as work:
        for profile in profiles:
            write_peft_adapter(profile.factors, Path(work), base_model="x", storage_format="bf16")
            sizes.append((Path(work) / "adapter_model.safetensors").stat().st_size)
    return max(sizes)


def limits(profiles: list[Profile], slot_counts, budget_units) -> list[list[Limit]]:
    """Per slot count or budget: the zenedge rows' limits (the baselines get `slots` slots)."""
    if not budget_units:
        return [[Limit(slots=k)] for k in slot_counts]
    unit = bf16_adapter_bytes(profiles)
    return [[Limit(slots=n, budget=n * unit, units=n, compress=c) for c in (False, True)] for n in budget_units]


def bench(profiles_dir: Path, base_dir: Path, resident, *, only=None, orders: int = 3, slot_counts=(2, 3, 4, 5),
          budget_units=None, examples: int = 32, thresholds=(0.7,), gate_examples: int = 32, methods=METHODS,
          log=print, first_order: int = 0) -> dict[str, Any]:
    profiles = load_profiles(profiles_dir, examples)
    if only:
        missing = set(only) - {p.name for p in profiles}
        if missing:
            raise ValueError(f"no LoRA profile named {', '.join(sorted(missing))} in {profiles_dir}")
        profiles = [p for p in profiles if p.name in only]
    with tempfile.TemporaryDirectory() as gate_dir:
        write_gate_slices(profiles, examples, gate_examples, Path(gate_dir))
        rows = _rows(profiles, base_dir, resident, range(first_order, first_order + orders),
                     limits(profiles, slot_counts, budget_units), examples, thresholds, methods, log)
    integration = integration_seconds(profiles)
    log(f"integration without the gate: {integration['mean']:.3f} s mean, {integration['max']:.3f} s max")
    return {"profiles": [{"name": p.name, "metric": p.metric, "base": p.base, "own": p.own} for p in profiles],
            "rows": rows, "integration_seconds": integration, "thresholds": list(thresholds), "examples": examples,
            "gate_examples": gate_examples}


def _rows(profiles: list[Profile], base_dir: Path, resident, orders: range, limit_sets: list[list[Limit]],
          examples: int, thresholds, methods, log) -> list[dict[str, Any]]:
    """Every (order, K, method) row: the pool built by that method, each profile scored on it."""
    from zenedge.runtime.variants import lora_variant

    scorer = Scorer(resident, examples)
    for profile in profiles:
        scorer.prepare(profile)
        profile.base = scorer.score(profile, None, "base")
        profile.own = scorer.score(profile, lora_variant("own", profile.factors, resident), "own")
        log(f"{profile.name}: base {profile.base} own {profile.own}")
    rows = []
    for order_index in orders:
        order = profiles[:]
        random.Random(1000 + order_index).shuffle(order)
        for limit_set in limit_sets:
            slots = limit_set[0].slots
            runs = [(f"zenedge@{t:g}{limit.label}", t, limit) for t in thresholds for limit in limit_set] \
                if "zenedge" in methods else []
            runs += [(m, None, None) for m in methods if m != "zenedge"]
            for label, threshold, limit in runs:
                if threshold is not None:
                    serving, times, actions = run_zenedge(order, limit, base_dir, threshold)
                    served = {}
                    for p in profiles:
                        entry = serving[p.name]
                        served[p.name] = (scorer.score(p, None, "base") if entry is None
                                          else scorer.score(p, entry[1], entry[0]))
                else:
                    factors, times = simulate(label, order, slots, seed=order_index)
                    actions = []
                    served = {p.name: scorer.score(p, lora_variant("m", factors[p.name], resident),
                                                   content_key(factors[p.name])) for p in profiles}
                scores = {p.name: normalised(p, served[p.name]) for p in profiles}
                row = {"order": order_index, "slots": slots, "budget_units": limit_set[0].units,
                       "budget_bytes": limit_set[0].budget, "method": label,
                       "S": sum(scores.values()) / len(scores), "scores": scores, "served": served,
                       "seconds_per_arrival": sum(times) / len(times), "arrival_seconds": times,
                       "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                       "actions": actions}
                rows.append(row)
                log(f"order {order_index} K={slots} {label:12s} S={row['S']:.3f} "
                    f"({row['seconds_per_arrival']:.2f} s/arrival)")
    return rows


def table(result: dict[str, Any]) -> str:
    """Markdown: per (K, method) the mean over orders of S clipped per profile to [0, 1] (the
    worst order in brackets), the same for the raw S, then per method the time per arrival,
    peak memory, and what the zenedge pools did with arrivals."""
    rows = result["rows"]
    slot_counts = sorted({r["slots"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))

    def of(method: str, k: int | None = None) -> list[dict]:
        return [r for r in rows if r["method"] == method and (k is None or r["slots"] == k)]

    by_bytes = any(r.get("budget_units") for r in rows)
    limit = "B (bf16 adapters)" if by_bytes else "K"

    def grid(value) -> list[str]:
        out = [f"| {limit} | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
        for k in slot_counts:
            cells = []
            for m in methods:
                values = [value(r) for r in of(m, k)]
                cells.append(f"{sum(values) / len(values):.3f} (min {min(values):.3f})")
            out.append(f"| {k} | " + " | ".join(cells) + " |")
        return out

    lines = ["S, each profile's score clipped to [0, 1]:", ""] + grid(lambda r: clipped_mean(r["scores"]))
    lines += ["", "S as defined (unclipped):", ""] + grid(lambda r: r["S"])
    lines += ["", f"| method | s per arrival (mean, all {limit}) | median s per arrival that merged | "
                  "median s per arrival that only compressed | peak RSS MB | arrivals: stored / merged / evicted | "
                  "adapters stored smaller | bytes used at the end (mean) |", "|---|---|---|---|---|---|---|---|"]
    for m in methods:
        actions = [a for r in of(m) for a in r["actions"]]
        counts = " / ".join(str([a["action"] for a in actions].count(kind)) for kind in ("stored", "merged", "evicted")) \
            if actions else "–"
        timed = [(a, t) for r in of(m) for a, t in zip(r["actions"], r.get("arrival_seconds", []))]
        merged = [t for a, t in timed if a["action"] == "merged"]
        compressed = [t for a, t in timed if a["action"] == "stored" and any(c["kept"] for c in a.get("compressed", []))]
        steps = sum(c["kept"] for a in actions for c in a.get("compressed", []))
        used = [r["actions"][-1]["used_bytes"] for r in of(m) if r["actions"] and "used_bytes" in r["actions"][-1]]
        median = lambda values: f"{statistics.median(values):.2f}" if values else "–"   # noqa: E731
        lines.append(f"| {m} | {sum(r['seconds_per_arrival'] for r in of(m)) / len(of(m)):.2f} | {median(merged)} | "
                     f"{median(compressed)} | {max(r['peak_rss_mb'] for r in of(m)):.0f} | {counts} | "
                     f"{steps if actions else '–'} | {format_size(int(sum(used) / len(used))) if used else '–'} |")
    return "\n".join(lines)


def run(profiles_dir: Path | None = None, *, only=None, orders: int = 3, slot_counts=(2, 3, 4, 5), budget_units=None,
        examples: int = 32, thresholds=None, gate_examples: int = 32, methods=METHODS, log=print,
        first_order: int = 0) -> dict[str, Any]:
    """The whole benchmark on the store's default base (converted on first use)."""
    from zenedge import bases, config, paths
    from zenedge.registry.sources import embedded_root
    from zenedge.runtime.engine import Engine
    from zenedge.store import Store

    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(sorted(unknown))}; choose from {', '.join(METHODS)}")
    cfg = config.load(paths.config_path())
    store = Store(paths.home())
    base = bases.ensure_base(store, bases.DEFAULT_BASE, progress=log)
    resident = Engine(store, cfg).resident(base["name"])
    return bench(profiles_dir or embedded_root(), store.home / base["dir"], resident, only=only, orders=orders,
                 slot_counts=tuple(slot_counts), budget_units=budget_units, examples=examples,
                 thresholds=tuple(thresholds or (cfg.pool.quality_threshold,)),
                 gate_examples=gate_examples, methods=tuple(methods), log=log, first_order=first_order)

