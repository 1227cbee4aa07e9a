"""S per K over every order measured: the floor (today's default) against the 2026-11-30 gate's
decisions rescored today, paired by order."""
import json, math, statistics
from zenedge.bench.merge import clipped_mean
B = "benchmarks/"
FLOOR = ["2026-12-01-merge-accuracy-floor-0.5-refusal-only.json", "2026-12-01-merge-accuracy-floor-0.5-refusal-only-orders-3-5-k34.json",
         "2026-12-02-merge-floor-orders-6-8-k34.json", "2026-12-02-merge-floor-orders-3-5-k25.json", "2026-12-02-merge-floor-orders-6-8-k5.json",
         "2026-12-02-merge-floor-orders-9-11-k5.json"]
REF = ["2026-12-01-merge-old-decisions-rescored.json", "2026-12-01-merge-old-gate-orders-3-5-rescored.json",
       "2026-12-02-merge-old-gate-orders-6-8-k34-rescored.json", "2026-12-02-merge-old-gate-orders-6-8-k5-rescored.json",
       "2026-12-02-merge-old-gate-orders-9-11-k5-rescored.json"]
def table(files):
    out = {}
    for f in files:
        for r in json.load(open(B + f))["rows"]:
            if r["method"].startswith("zenedge@0.7"):
                out[(r["slots"], r["order"])] = clipped_mean(r["scores"])
    return out
floor, ref = table(FLOOR), table(REF)
print("| K | orders | floor (default) | reference (2026-11-30 decisions, rescored) | paired difference ± SE |")
print("|---|---|---|---|---|")
for K in (2, 3, 4, 5):
    orders = sorted(o for (k, o) in floor if k == K and (k, o) in ref)
    d = [floor[(K, o)] - ref[(K, o)] for o in orders]
    se = statistics.stdev(d) / math.sqrt(len(d))
    print(f"| {K} | {orders[0]}-{orders[-1]} ({len(orders)}) | {statistics.mean(floor[(K, o)] for o in orders):.3f} | "
          f"{statistics.mean(ref[(K, o)] for o in orders):.3f} | {statistics.mean(d):+.3f} ± {se:.3f} |")
