"""Issue [V]'s A/B: decode tokens/s on the default base under transformers 5.24, 5.25 as zenedge now
loads it (no hub kernels), and 5.25 as transformers loads it by default (hub kernels on, the lean
forward refused), interleaved in rounds on one home:

    python3.11 tools/ab_hub_kernels.py V524 V525 [--rounds 3] > benchmarks/DATE-hub-kernels.json

V524 / V525: venvs with zenedge installed (editable) and those transformers; $ZENEDGE_HOME holds the base.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RATE = str(REPO / "tools" / "decode_rate.py")
# transformers' own default load, in place of zenedge's: what every load did before this issue's fix
DEFAULT_LOAD = f"""
import runpy
import zenedge.runtime.model as model
def plain(source, **kwargs):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(source, **kwargs)
model.load_causal_lm = plain
runpy.run_path({RATE!r}, run_name="__main__")
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("v524", type=Path)
    parser.add_argument("v525", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = {"5.24": [str(args.v524 / "bin" / "python"), "-P", RATE],
            "5.25, zenedge's load": [str(args.v525 / "bin" / "python"), "-P", RATE],
            "5.25, transformers' default load": [str(args.v525 / "bin" / "python"), "-P", "-c", DEFAULT_LOAD]}
    results = {label: [] for label in rows}
    for round_ in range(args.rounds):
        for label, argv in rows.items():
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            results[label].append(result)
            print(f"round {round_ + 1} {label}: {result['tokens_per_s']:.1f} tok/s, "
                  f"{result['decode_path']['forward']} forward", file=sys.stderr)
    best = {label: max(r["tokens_per_s"] for r in runs) for label, runs in results.items()}
    reference = best["5.24"]
    print(json.dumps({"cpu": platform.processor() or platform.machine(), "rounds": args.rounds,
                      "best_tokens_per_s": best, "vs_5.24": {k: v / reference for k, v in best.items()},
                      "runs": results}, indent=1))


if __name__ == "__main__":
    main()
