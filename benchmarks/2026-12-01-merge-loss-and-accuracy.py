"""bench merge S with a stricter gate verdict: a member with a token-accuracy gain must keep the
threshold in answer likelihood AND in answer tokens right (the default: OR). Motivated by `units`,
which passes merges at loss retention 0.72-0.81 and then answers none of its scored examples.
Writes the result JSON to argv[1]; argv[2] (optional): slot counts, e.g. "3,4,5" (default
2,3,4,5); argv[3] (optional): the first order (default 0). Runs at or after abde938 (least-loss
weighs two refused merges) measure AND with it. The explored pool timings with AND were made by
writing `both` into gate.verdict_of for the run (`bench pool` starts fresh processes)."""
import json, sys
import zenedge.pool.gate as gate
from zenedge.pool.gate import Verdict


def both(loss, accuracy):
    if accuracy is None:
        return loss, "loss"
    for value, metric in ((loss, "loss"), (accuracy, "accuracy")):
        if value.decided and not value.passed:
            return value, metric
    if loss.decided and accuracy.decided:
        return (loss, "loss") if loss.retention <= accuracy.retention else (accuracy, "accuracy")
    return Verdict(False, False, min(loss.retention, accuracy.retention), loss.examples), "loss"


gate.verdict_of = both
from zenedge.bench import merge as merge_bench
slots = tuple(int(k) for k in (sys.argv[2] if len(sys.argv) > 2 else "2,3,4,5").split(","))
first = int(sys.argv[3]) if len(sys.argv) > 3 else 0
result = merge_bench.run(None, orders=3, first_order=first, slot_counts=slots, examples=16, thresholds=(0.7,),
                         gate_examples=32, methods=["zenedge"], log=lambda m: print(f"[bench] {m}", flush=True))
result["verdict"] = "loss AND accuracy"
open(sys.argv[1], "w").write(json.dumps(result, indent=2, default=str))
print(merge_bench.table(result))
