"""bench merge S with the default verdict plus a floor: a member passes if the merge keeps the
threshold of its gain in answer likelihood OR in answer tokens right (the default), and keeps at
least FLOOR of it in both (a member with a token-accuracy gain). Meant to refuse what AND refuses
far from the threshold (`units` keeping 0.72-0.81 of its likelihood gain and answering none of its
scored examples) without AND's slow near-threshold refusals. Writes the result JSON to argv[1];
argv[2] (optional): slot counts (default 2,3,4,5); argv[3] (optional): the first order (default 0);
argv[4] (optional): the floor (default 0.5); argv[5] (optional): "refusal-only" to let the floor only
refuse (a pass on the threshold does not wait for the floors' verdicts)."""
import json, sys
import zenedge.pool.gate as gate
from zenedge.pool.gate import Verdict, accuracy_verdict, verdict

FLOOR = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
REFUSAL_ONLY = len(sys.argv) > 5 and sys.argv[5] == "refusal-only"
original_decide = gate.QualityGate._decide


def with_floor(s, threshold):
    decision, metric = original_decide(s, threshold)
    n = len(s.merged)
    if s.legacy or len(s.own_hits) < n:
        return decision, metric
    accuracy = accuracy_verdict(s.base_hits, s.own_hits, s.merged_hits, s.tokens, FLOOR, s.population)
    if accuracy is None:
        return decision, metric
    floors = ((verdict(s.base, s.own, s.merged, s.tokens, FLOOR, s.population), "loss"), (accuracy, "accuracy"))
    for value, name in floors:  # below the floor in either: refused, whatever the other says
        if value.decided and not value.passed:
            return Verdict(True, False, value.retention, n), name
    if decision.decided and decision.passed and not REFUSAL_ONLY and not all(value.decided for value, _ in floors):
        return Verdict(False, False, decision.retention, n), metric  # passed, floors not yet known
    return decision, metric


gate.QualityGate._decide = staticmethod(with_floor)
from zenedge.bench import merge as merge_bench
slots = tuple(int(k) for k in (sys.argv[2] if len(sys.argv) > 2 else "2,3,4,5").split(","))
first = int(sys.argv[3]) if len(sys.argv) > 3 else 0
result = merge_bench.run(None, orders=3, first_order=first, slot_counts=slots, examples=16, thresholds=(0.7,),
                         gate_examples=32, methods=["zenedge"], log=lambda m: print(f"[bench] {m}", flush=True))
result["verdict"] = f"loss OR accuracy, and both at least {FLOOR}" + (" (refusal only)" if REFUSAL_ONLY else "")
open(sys.argv[1], "w").write(json.dumps(result, indent=2, default=str))
print(merge_bench.table(result))
