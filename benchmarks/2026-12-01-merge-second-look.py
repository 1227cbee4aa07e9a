"""(Runs at commit 81f398b, where zenedge.pool.merger has SECOND_LOOK; explored and not kept.)
bench merge S with the second look at SECOND_LOOK = argv[2] (1.01: after every kept merge the next
candidate is gated too, and the merge that loses less is kept). Writes the result JSON to argv[1]."""
import json, sys
import zenedge.pool.merger as merger
merger.SECOND_LOOK = float(sys.argv[2])
from zenedge.bench import merge as merge_bench
result = merge_bench.run(None, orders=3, slot_counts=(2, 3, 4, 5), examples=16, thresholds=(0.7,), gate_examples=32,
                         methods=["zenedge"], log=lambda m: print(f"[bench] {m}", flush=True))
result["second_look"] = merger.SECOND_LOOK
open(sys.argv[1], "w").write(json.dumps(result, indent=2, default=str))
print(merge_bench.table(result))
