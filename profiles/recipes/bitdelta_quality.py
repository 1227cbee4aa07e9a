"""BitDelta quality on real full fine-tunes of the default base (issue B's table):

    python -m profiles.recipes.bitdelta_quality /work/finetunes/math-full --eval profiles/math-full/eval.jsonl \\
        --out profiles/math-full/delta.safetensors --distill-steps 100

Compresses the fine-tune against the base (sizes: base, full delta, 1-bit delta, ratio), optionally
distils the scales on offline calibration text, and scores base / fine-tune / 1-bit /
1-bit + distillation on the profile's eval set (answer loss, and greedy exact match when the
answers are checkable). The 1-bit rows run through zenedge's runtime (the serving path).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def score(model, tokenizer, encoded, exact: bool) -> dict[str, float]:
    from zenedge.bench.exact_match import exact_match
    from zenedge.evaluation import answer_loss

    pad = tokenizer.pad_token_id or 0
    result = {"loss": round(answer_loss(model, encoded, 16, pad), 4)}
    if exact:
        result["exact_match"] = round(exact_match(model, tokenizer, encoded, batch_size=16), 4)
    return result


class WithVariant(torch.nn.Module):
    """The resident base with one variant applied to every row (what serving does)."""

    def __init__(self, resident, variant):
        super().__init__()
        self.resident, self.variant = resident, variant

    def forward(self, **kwargs):
        with self.resident.state.using([self.variant], plain=True):   # as the gate scores
            return self.resident.model(**kwargs)


def run(finetuned: Path, eval_path: Path, out: Path | None, distill_steps: int, metric: str,
        examples: int, calibration_batches: int = 16, log=print) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from zenedge import bases, config, paths
    from zenedge.bitdelta import (build_calibration_batches, compress_model, distill_scales, load_bitdelta,
                                  save_bitdelta, stdlib_texts, with_alphas)
    from zenedge.evaluation import encode_examples, load_eval_set
    from zenedge.runtime.engine import Engine
    from zenedge.runtime.variants import load_bitdelta as load_variant
    from zenedge.store import Store

    store = Store(paths.home())
    base = bases.ensure_base(store, bases.DEFAULT_BASE, progress=log)
    base_dir = store.home / base["dir"]
    with tempfile.TemporaryDirectory() as scratch:  # the quality table is measured in fp32 on CPU
        cfg_path = Path(scratch) / "config.toml"
        cfg_path.write_text('[runtime]\ndevice = "cpu"\ndtype = "float32"\n')
        cfg = config.load(cfg_path)
    resident = Engine(store, cfg).resident(base["name"])
    tokenizer = resident.tokenizer
    encoded = encode_examples(tokenizer, load_eval_set(eval_path)[:examples], 384)
    exact = metric == "exact_match"
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        raw = Path(work) / "raw.bitdelta"
        start = time.perf_counter()
        report = compress_model(base_dir, finetuned, raw, base_sha256=base["sha256"])
        sizes = {"base_bytes": sum(p.stat().st_size for p in base_dir.glob("*.safetensors")),
                 "full_delta_bytes": report.bytes_full_delta, "bitdelta_bytes": report.file_bytes,
                 "ratio": round(report.bytes_full_delta / report.file_bytes, 2),
                 "mean_relative_error": round(report.mean_relative_error, 4),
                 "compress_seconds": round(time.perf_counter() - start, 1)}
        log(f"sizes {sizes}")
        rows["base"] = score(WithVariant(resident, None), tokenizer, encoded, exact)
        log(f"base {rows['base']}")
        tuned = AutoModelForCausalLM.from_pretrained(finetuned, dtype=torch.float32).eval()
        rows["fine-tune"] = score(tuned, tokenizer, encoded, exact)
        log(f"fine-tune {rows['fine-tune']}")
        rows["1-bit"] = score(WithVariant(resident, load_variant("raw", raw, resident.device)), tokenizer, encoded, exact)
        log(f"1-bit {rows['1-bit']}")
        final = raw
        if distill_steps:
            base_model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
            batches = build_calibration_batches(stdlib_texts(), tokenizer, max_batches=calibration_batches)
            data = load_bitdelta(raw)
            result = distill_scales(base_model, tuned, data, batches, distill_steps)
            final = Path(work) / "distilled.bitdelta"
            save_bitdelta(final, with_alphas(data, result.alphas))
            sizes["distill_logit_mse"] = [round(result.loss_before, 5), round(result.loss_after, 5)]
            sizes["distill"] = {"steps": distill_steps, "calibration_batches": len(batches), "batch": "4 x 128 tokens",
                                "lr": "1e-3 on log alpha", "text": "Python stdlib sources"}
            rows["1-bit + distillation"] = score(WithVariant(resident, load_variant("d", final, resident.device)),
                                                 tokenizer, encoded, exact)
            log(f"1-bit + distillation {rows['1-bit + distillation']} (logit MSE {sizes['distill_logit_mse']})")
        if out is not None:
            shutil.copyfile(final, out)
    return {"finetuned": str(finetuned), "eval": str(eval_path), "examples": len(encoded), "sizes": sizes,
            "rows": rows}


def table(result: dict[str, Any]) -> str:
    keys = [k for k in ("loss", "exact_match") if k in result["rows"]["base"]]
    lines = ["| model | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, row in result["rows"].items():
        lines.append(f"| {name} | " + " | ".join(str(row[k]) for k in keys) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("finetuned", type=Path)
    parser.add_argument("--eval", type=Path, required=True)
    parser.add_argument("--metric", default="loss", choices=["loss", "exact_match"])
    parser.add_argument("--out", type=Path, default=None, help="write the (distilled) .bitdelta file here")
    parser.add_argument("--distill-steps", type=int, default=100)
    parser.add_argument("--calibration-batches", type=int, default=16)
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args.finetuned, args.eval, args.out, args.distill_steps, args.metric, args.examples,
                 args.calibration_batches)
    print(json.dumps(result["sizes"]))
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
