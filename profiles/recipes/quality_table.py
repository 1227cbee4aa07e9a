"""Render profiles/quality.json and the recipe cards as the tables in profiles/README.md.

    python -m profiles.recipes.quality_table            # print the tables
    python -m profiles.recipes.quality_table --write    # replace them in profiles/README.md

Only measured numbers appear: a profile without a measurement shows "not measured"; the
BitDelta columns (loss / exact match of the 1-bit delta, before and after scale distillation)
come from profiles/<name>/bitdelta_quality.json, written by whoever compresses the full
fine-tune, and stay TODO until that file exists.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PROFILES = Path(__file__).resolve().parent.parent
README = PROFILES / "README.md"
BEGIN, END = "<!-- quality-tables:begin -->", "<!-- quality-tables:end -->"


def _cards() -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(PROFILES.glob("*/recipe.json"))}


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _em(entry: dict | None) -> str:
    return "–" if not entry or "exact_match" not in entry else f"{100 * entry['exact_match']:.0f}%"


def training_table(cards: dict[str, dict]) -> str:
    rows = ["| profile | kind | task | train ex. | steps × batch | max len | lr | s/step | final train loss |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, card in cards.items():
        r = card["recipe"]
        rows.append(f"| `{name}` | {card['kind']} | {card['description']} | {r['train_examples']} | "
                    f"{r['steps']} × {r['batch']} | {r['max_len']} | {r['lr']:g} | {r['seconds_per_step']:.2f} | "
                    f"{r['final_train_loss']:.3f} |")
    return "\n".join(rows)


def _bitdelta_cells(name: str, metric: str) -> tuple[str, str]:
    """The 1-bit columns, from profiles/<name>/bitdelta_quality.json (written by whoever
    compresses the fine-tune, with its own measurement of the same eval set) or TODO."""
    path = PROFILES / name / "bitdelta_quality.json"
    if not path.exists():
        return "TODO (after compression)", "TODO (after compression)"
    rows = json.loads(path.read_text()).get("rows", {})

    def cell(row: dict | None) -> str:
        if not row:
            return "TODO"
        return f"{_fmt(row['loss'])} / {_em(row)}" if metric == "exact_match" else _fmt(row["loss"])
    return cell(rows.get("1-bit")), cell(rows.get("1-bit + distillation"))


def quality_table(cards: dict[str, dict], quality: dict) -> str:
    rows = ["| profile | kind | metric | n | loss base → profile | exact match base → profile | "
            "1-bit (BitDelta) | 1-bit + scale distillation |",
            "|---|---|---|---:|---|---|---|---|"]
    for name, card in cards.items():
        entry = quality.get(name, {})
        base, prof = entry.get("base"), entry.get("profile")
        one_bit, distilled = _bitdelta_cells(name, card["metric"]) if card["kind"] == "bitdelta" else ("n/a", "n/a")
        if not prof:
            rows.append(f"| `{name}` | {card['kind']} | {card['metric']} | – | not measured | not measured | "
                        f"{one_bit} | {distilled} |")
            continue
        em = f"{_em(base)} → **{_em(prof)}**" if card["metric"] == "exact_match" else "–"
        rows.append(f"| `{name}` | {card['kind']} | {card['metric']} | {prof['n']} | "
                    f"{_fmt(base['loss'])} → **{_fmt(prof['loss'])}** | {em} | {one_bit} | {distilled} |")
    return "\n".join(rows)


def cross_table(quality: dict) -> str:
    rows = ["| adapter | on eval set of | loss: base / this adapter / the set's own profile | "
            "exact match: base / this adapter / own |", "|---|---|---|---|"]
    for target in sorted(t for t in quality if not t.startswith("_")):
        entry = quality[target]
        for adapter, measured in sorted(entry.get("cross", {}).items()):
            own = entry.get("profile", {})
            rows.append(f"| `{adapter}` | `{target}` | {_fmt(entry['base']['loss'])} / {_fmt(measured['loss'])} / "
                        f"{_fmt(own.get('loss'))} | {_em(entry['base'])} / {_em(measured)} / {_em(own)} |")
    return "\n".join(rows)


def similarity_table(quality: dict) -> str:
    matrix = quality.get("_similarity", {})
    if not matrix:
        return "not measured (run `python -m profiles.recipes.similarity`)"
    names = sorted(matrix)
    rows = ["| | " + " | ".join(f"`{n}`" for n in names) + " |", "|---|" + "---:|" * len(names)]
    for a in names:
        rows.append(f"| `{a}` | " + " | ".join("–" if a == b else f"{matrix[a][b]:+.3f}" for b in names) + " |")
    return "\n".join(rows)


def bitdelta_table(cards: dict[str, dict]) -> str:
    """Per BitDelta profile, one run of profiles/recipes/bitdelta_quality.py: every row measured together
    (the same eval examples, fp32, the 1-bit rows through zenedge's serving path)."""
    rows = ["| profile | n | base | full fine-tune | 1-bit | 1-bit + scale distillation | fp32 delta → 1-bit file "
            "| distillation logit MSE (calibration) |", "|---|---:|---|---|---|---|---|---|"]
    for name, card in cards.items():
        path = PROFILES / name / "bitdelta_quality.json"
        if card["kind"] != "bitdelta" or not path.exists():
            continue
        result = json.loads(path.read_text())
        sizes, measured = result["sizes"], result["rows"]

        def cell(row: str) -> str:
            got = measured.get(row)
            if not got:
                return "–"
            return f"{_fmt(got['loss'])} / {_em(got)}" if "exact_match" in got else _fmt(got["loss"])
        mse = sizes.get("distill_logit_mse")
        rows.append(f"| `{name}` | {result['examples']} | {cell('base')} | {cell('fine-tune')} | {cell('1-bit')} | "
                    f"{cell('1-bit + distillation')} | {sizes['full_delta_bytes'] / 1e6:.0f} MB → "
                    f"{sizes['bitdelta_bytes'] / 1e6:.1f} MB ({sizes['ratio']}×) | "
                    f"{f'{mse[0]:.4f} → {mse[1]:.4f}' if mse else '–'} |")
    return "\n".join(rows)


def reproduce_block(cards: dict[str, dict]) -> str:
    """The exact command each profile was trained with (from its card)."""
    lines = [card["recipe"]["command"] for card in cards.values()]
    return "```\n" + "\n".join(lines) + "\n```"


def render() -> str:
    cards = _cards()
    quality_path = PROFILES / "quality.json"
    quality = json.loads(quality_path.read_text()) if quality_path.exists() else {}
    return "\n\n".join([
        "### Training (this machine: 2 shared CPU cores, bf16 autocast)", training_table(cards),
        "### Quality on each profile's own held-out eval set", quality_table(cards, quality),
        "### BitDelta profiles: full fine-tune vs 1-bit vs 1-bit + scale distillation (loss / exact match, "
        "one run each)", bitdelta_table(cards),
        "### Cross evaluation (adapters on related and unrelated eval sets)", cross_table(quality),
        "### Adapter similarity (K-Merge cosine of ΔW = B·A, mean over modules)", similarity_table(quality),
        "### Training commands (from each recipe.json)", reproduce_block(cards),
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"replace the tables in {README}")
    args = parser.parse_args(argv)
    tables = render()
    if not args.write:
        print(tables)
        return
    text = README.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{tables}\n{END}{tail}")


if __name__ == "__main__":
    main()
