"""bench merge S with the gate reading every gate example (no sequential early stop): the control
for what the sequential test costs in merge decisions."""
import json, sys
import zenedge.pool.verdict as verdict
verdict.CONFIDENCE = 1e9
verdict.INDIFFERENCE = 0.0
from zenedge.bench import merge as merge_bench
result = merge_bench.run(None, orders=3, slot_counts=(2, 3, 4, 5), examples=16, thresholds=(0.7,), gate_examples=32,
                         methods=["zenedge"], log=lambda m: print(f"[bench] {m}", flush=True))
open(sys.argv[1], "w").write(json.dumps(result, indent=2, default=str))
print(merge_bench.table(result))
