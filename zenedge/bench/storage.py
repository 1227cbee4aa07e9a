"""`zenedge bench storage`: what each storage format (adapters/storage.py) keeps of every profile.

For each LoRA profile of a registry folder, its adapter is scored on its own eval set as shipped
and as it reads back after storing it in each format (the same round trip the pool gates and
serves). Per format and profile: the answer-loss retention (L_base − L)/(L_base − L_own), and for
profiles with exact answers, exact match ÷ the adapter's own. Also the file size in each format.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

FORMATS = ("int8", "int4")


def run(profiles_dir: Path | None = None, *, examples: int = 100, formats=FORMATS, log=print) -> dict[str, Any]:
    from zenedge import bases, config, paths
    from zenedge.bench.merge import Scorer, load_profiles
    from zenedge.registry.sources import embedded_root
    from zenedge.runtime.engine import Engine
    from zenedge.store import Store

    cfg = config.load(paths.config_path())
    store = Store(paths.home())
    base = bases.ensure_base(store, bases.DEFAULT_BASE, progress=log)
    resident = Engine(store, cfg).resident(base["name"])
    scorer = Scorer(resident, examples)
    rows = []
    for profile in load_profiles(profiles_dir or embedded_root(), examples):
        rows.append(_profile_row(profile, scorer, resident, formats))
        log(_line(rows[-1]))
    return {"examples": examples, "formats": list(formats), "rows": rows}


def _profile_row(profile, scorer, resident, formats) -> dict[str, Any]:
    from zenedge.adapters.lora_tensors import round_to, stored_format, write_peft_adapter
    from zenedge.bench.merge import content_key
    from zenedge.pool.verdict import retention
    from zenedge.runtime.variants import lora_variant

    scorer.prepare(profile)
    base = scorer.score(profile, None, "base")
    own = scorer.score(profile, lora_variant("own", profile.factors, resident), "own")
    weights = profile.adapter_dir / "adapter_model.safetensors"
    row = {"name": profile.name, "metric": profile.metric, "stored_as": stored_format(weights),
           "bytes": {"as shipped": weights.stat().st_size}, "base": base, "own": own, "formats": {}}
    for fmt in formats:
        factors = round_to(profile.factors, fmt)
        served = scorer.score(profile, lora_variant(fmt, factors, resident), content_key(factors))
        entry = {"loss": served["loss"], "loss_retention": retention(base["loss"], own["loss"], served["loss"])}
        if "accuracy" in served:
            entry["accuracy"] = served["accuracy"]
            entry["accuracy_ratio"] = served["accuracy"] / own["accuracy"] if own["accuracy"] else None
        with tempfile.TemporaryDirectory() as work:
            write_peft_adapter(profile.factors, Path(work), base_model="x", storage_format=fmt)
            row["bytes"][fmt] = (Path(work) / "adapter_model.safetensors").stat().st_size
        row["formats"][fmt] = entry
    return row


def _line(row: dict[str, Any]) -> str:
    parts = []
    for fmt, entry in row["formats"].items():
        accuracy = f", exact {entry['accuracy_ratio']:.3f}" if entry.get("accuracy_ratio") is not None else ""
        parts.append(f"{fmt}: loss {entry['loss_retention']:.4f}{accuracy}")
    return f"{row['name']}: " + "; ".join(parts)


def table(result: dict[str, Any]) -> str:
    """Markdown: per profile and format, loss retention, exact-match ratio, and bytes."""
    formats = result["formats"]
    head = "| profile | metric | loss base → own | exact base → own | " + " | ".join(
        f"{f} loss kept | {f} exact kept" for f in formats) + " | bytes: " + " / ".join(["shipped", *formats]) + " |"
    lines = [head, "|" + "---|" * (5 + 2 * len(formats))]
    for row in result["rows"]:
        exact = (f"{row['base']['accuracy']:.2f} → {row['own']['accuracy']:.2f}" if "accuracy" in row["own"] else "–")
        cells = [row["name"], row["metric"], f"{row['base']['loss']:.3f} → {row['own']['loss']:.3f}", exact]
        for f in formats:
            entry = row["formats"][f]
            cells.append(f"{entry['loss_retention']:.4f}")
            ratio = entry.get("accuracy_ratio")
            cells.append(f"{ratio:.3f}" if ratio is not None else "–")
        cells.append(" / ".join(str(row["bytes"][k]) for k in ["as shipped", *formats]))
        lines.append("| " + " | ".join(cells) + " |")
    for f in formats:
        losses = [r["formats"][f]["loss_retention"] for r in result["rows"]]
        ratios = [r["formats"][f]["accuracy_ratio"] for r in result["rows"] if r["formats"][f].get("accuracy_ratio")]
        lines.append(f"\n{f}: loss retention min {min(losses):.4f}, mean {sum(losses) / len(losses):.4f}"
                     + (f"; exact-match ratio min {min(ratios):.3f}, mean {sum(ratios) / len(ratios):.3f}"
                        if ratios else ""))
    return "\n".join(lines)
