"""The 2026-11-30 gate's decisions on three more arrival orders (3-5), so the like-for-like
reference for "S no lower than the table" stands on six orders, not three. Runs the code of that
table (1ba3b1f) as it was, from a worktree, with one change: `_rows` starts at order FIRST_ORDER
(the orders are the same seeded shuffles, `random.Random(1000 + order)`, then and now):

    git worktree add /tmp/old-gate 1ba3b1f
    # in /tmp/old-gate/zenedge/bench/merge.py, `_rows`:
    #     for order_index in range(orders):  ->  first = int(os.environ.get("FIRST_ORDER", "0"))
    #                                             for order_index in range(first, first + orders):
    FIRST_ORDER=3 ZENEDGE_HOME=/tmp/oldhome OMP_NUM_THREADS=1 PYTHONPATH=/tmp/old-gate \\
        python benchmarks/2026-12-01-merge-old-gate-orders-3-5.py OUT.json

(a fresh home: the old code converts the base itself; ~1 h 50 min on one core beside another
benchmark). Its S column uses that day's scorer; `2026-12-01-merge-old-decisions-rescored.py
RESCORED.json OUT.json` replays the decisions with today's merge code and scores them today.
argv[2] (optional): the slot counts, e.g. "3,4" (default "2,3,4,5"). Orders 6-8 (2026-12-02) ran
with FIRST_ORDER=6 and "3,4", then "5"."""
import json, sys

import zenedge

assert zenedge.__file__.startswith("/tmp/old-gate"), f"run from the 1ba3b1f worktree, not {zenedge.__file__}"
from zenedge.bench import merge

slots = tuple(int(k) for k in (sys.argv[2] if len(sys.argv) > 2 else "2,3,4,5").split(","))
out = merge.run(orders=3, slot_counts=slots, examples=16, thresholds=(0.7,), gate_examples=32,
                methods=("zenedge",), log=lambda m: print(m, flush=True))
json.dump(out, open(sys.argv[1], "w"), indent=1, default=str)
