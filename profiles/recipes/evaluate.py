"""Measure base vs. profile on each profile's own eval set; results go to profiles/quality.json.

    python -m profiles.recipes.evaluate arith wordmath          # own eval sets
    python -m profiles.recipes.evaluate --cross arith           # adapter on related eval sets

For a LoRA profile the adapter is loaded with PEFT onto the base; for a BitDelta profile the
full fine-tune from /work/finetunes/<name>/ stands in (the 1-bit columns are filled by whoever
compresses it). Metrics come from zenedge.evaluation: answer loss (teacher-forced CE per answer
token) always, greedy exact match (zenedge.bench.exact_match) when the recipe's metric is
exact_match. Matmuls run under bf16 autocast (faster where the CPU has AMX); base and profile are
measured the same way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import time
from pathlib import Path

import torch

from zenedge.bench.exact_match import exact_match
from zenedge.evaluation import answer_loss, encode_examples, load_eval_set

PROFILES = Path(__file__).resolve().parent.parent
RESULTS = PROFILES / "quality.json"
EVAL_MAX_LEN = 512  # no truncation at eval time: every eval example fits whole

# Adapter -> other profiles' eval sets it is also scored on: its similar twin and a far one.
CROSS = {
    "arith": ["wordmath", "units"], "wordmath": ["arith", "jsonx"], "units": ["arith"],
    "jsonx": ["csvx", "arith"], "csvx": ["jsonx"], "writer": ["manpage", "coder"],
    "manpage": ["writer"], "coder": ["writer"], "license": ["writer"],
}


def _recipe(name: str) -> dict:
    return json.loads((PROFILES / name / "recipe.json").read_text())


def load_profile_model(name: str, base_dir: str, finetunes: Path):
    """The model a profile serves: base + LoRA (PEFT), or the full fine-tune; or the base."""
    from transformers import AutoModelForCausalLM

    if name == "base":
        return AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    kind = _recipe(name)["kind"]
    if kind == "lora":
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        return PeftModel.from_pretrained(base, PROFILES / name / "adapter").eval()
    return AutoModelForCausalLM.from_pretrained(finetunes / name, dtype=torch.float32).eval()


def score(model, tokenizer, eval_name: str, batch_size: int) -> dict:
    """Loss (and exact match where the eval set's profile is exact-match) of `model`."""
    examples = load_eval_set(PROFILES / eval_name / "eval.jsonl")
    encoded = encode_examples(tokenizer, examples, EVAL_MAX_LEN)
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        result = {"n": len(encoded), "loss": round(answer_loss(model, encoded, batch_size), 4)}
        if _recipe(eval_name)["metric"] == "exact_match":
            result["exact_match"] = round(exact_match(model, tokenizer, encoded, batch_size=batch_size), 4)
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def _save(results: dict) -> None:
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", help="profiles to evaluate")
    parser.add_argument("--cross", action="store_true", help="score the adapters on CROSS eval sets instead")
    parser.add_argument("--base", default="/work/smollm2-hf")
    parser.add_argument("--finetunes", type=Path, default=Path("/work/finetunes"))
    parser.add_argument("--batch", type=int, default=16)
    # One thread: with the 2 cores shared, 2 OpenMP threads spin at barriers while the other is
    # descheduled (measured: 11 CPU-s per LoRA step with 2 threads vs 2 CPU-s with 1).
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    today = dt.date.today().isoformat()
    for name in args.names:
        targets = CROSS.get(name, []) if args.cross else [name]
        model = load_profile_model(name, args.base, args.finetunes)
        for target in targets:
            digest = hashlib.sha256((PROFILES / target / "eval.jsonl").read_bytes()).hexdigest()
            if results.get(target, {}).get("eval_sha256") != digest:  # new eval set: old numbers are void
                results[target] = {"eval_sha256": digest}
            entry = results[target]
            if "base" not in entry:  # the base's score on a set never changes: measure it once
                entry["base"] = score(load_profile_model("base", args.base, args.finetunes),
                                      tokenizer, target, args.batch)
            measured = score(model, tokenizer, target, args.batch)
            measured["date"] = today
            if args.cross:
                entry.setdefault("cross", {})[name] = measured
            else:
                entry["profile"] = measured
                entry["kind"] = _recipe(name)["kind"]
            _save(results)  # after every measurement: a long run that dies keeps what it did
            print(f"{name} on {target}: base {entry['base']} -> {measured}", flush=True)


if __name__ == "__main__":
    main()
