"""bench merge S with a third gate verdict: where a member's own adapter gains answer tokens right
(ACCURACY_GAIN), token accuracy alone decides; elsewhere answer likelihood (the default: loss OR
accuracy, 2026-12-01-merge-loss-and-accuracy.py: loss AND accuracy). Keeps the near-deterministic
members the OR rule was made for (all answers still right at 60 % of the likelihood gain) and
refuses `units`-like merges (loss retention 0.72-0.81, no answer right). Writes JSON to argv[1];
argv[2] (optional): slot counts, e.g. "2" (default 2,3,4,5)."""
import json, sys
import zenedge.pool.gate as gate


def accuracy_first(loss, accuracy):
    return (loss, "loss") if accuracy is None else (accuracy, "accuracy")


gate.verdict_of = accuracy_first
from zenedge.bench import merge as merge_bench
slots = tuple(int(k) for k in (sys.argv[2] if len(sys.argv) > 2 else "2,3,4,5").split(","))
result = merge_bench.run(None, orders=3, slot_counts=slots, examples=16, thresholds=(0.7,), gate_examples=32,
                         methods=["zenedge"], log=lambda m: print(f"[bench] {m}", flush=True))
result["verdict"] = "accuracy where gained, else loss"
open(sys.argv[1], "w").write(json.dumps(result, indent=2, default=str))
print(merge_bench.table(result))
