"""The 2026-11-30 K-Merge table's merge decisions, replayed with today's merge code and scored with
today's scorer: the like-for-like reference for "S no lower than the table" (the table's numbers
came from a scorer whose greedy decode has since changed: arith's own adapter answers 5 of its 16
scored examples now, 4 then, which alone moves arith's normalised score by 20 %).

Every (order, K) row of profiles/merge_bench.json: the pool is rebuilt arrival by arrival as the
table's zenedge@0.7 pool did it (stored / merged with the same members / evicted), each merge a
low-rank OPCM step (alpha 0.5, rank cap = the larger member's) continuing the slot's state and
rounded to the slot's dtype as the pool stores it; then every profile is scored as `bench merge`
scores it. Writes the JSON to argv[1] and prints the table. argv[2] (optional): another `bench merge`
JSON of the 2026-11-30 code's decisions (orders 3-5 were run at 1ba3b1f later, see BENCHMARKS.md);
default: the embedded merge_bench.json."""
import json, statistics, sys
from pathlib import Path

from zenedge import bases, config, paths
from zenedge.adapters.lora_tensors import round_to, stored_dtype
from zenedge.bench import merge as merge_bench
from zenedge.pool.merger import fold
from zenedge.registry.sources import embedded_root
from zenedge.runtime.engine import Engine
from zenedge.runtime.variants import lora_variant
from zenedge.store import Store

decisions = Path(sys.argv[2]) if len(sys.argv) > 2 else embedded_root() / "merge_bench.json"
old = json.loads(decisions.read_text())
cfg = config.load(paths.config_path())
store = Store(paths.home())
resident = Engine(store, cfg).resident(bases.ensure_base(store, bases.DEFAULT_BASE)["name"])
profiles = {p.name: p for p in merge_bench.load_profiles(embedded_root(), 16)}
scorer = merge_bench.Scorer(resident, 16)
for p in profiles.values():
    scorer.prepare(p)
    p.base = scorer.score(p, None, "base")
    p.own = scorer.score(p, lora_variant("own", p.factors, resident), "own")


def replay(actions):
    slots = []  # {"members", "factors", "state", "dtype"}
    for action in actions:
        newcomer = profiles[action["name"]]
        if action["action"] == "merged":
            [slot] = [s for s in slots if set(s["members"]) == set(action["merged_with"])]
            cap = max(f.rank for a in (slot["factors"], newcomer.factors) for f in a.values())
            state = fold(slot["factors"], slot["state"], newcomer.factors, cap)  # the pool's own fold
            slot["factors"] = round_to(state.merged, slot["dtype"])  # as stored, and read back
            slot["state"] = {"lam": state.lam, "norms": state.norms}
            slot["members"].append(newcomer.name)
            continue
        if action["action"] == "evicted":
            slots = [s for s in slots if not set(s["members"]) & set(action["evicted"])]
        slots.append({"members": [newcomer.name], "factors": newcomer.factors, "state": None,
                      "dtype": stored_dtype(newcomer.adapter_dir / "adapter_model.safetensors")})
    return {m: s for s in slots for m in s["members"]}


rows = []
for row in old["rows"]:
    if row["method"] != "zenedge@0.7":
        continue
    serving = replay(row["actions"])
    served = {}
    for name, p in profiles.items():
        slot = serving.get(name)
        served[name] = (scorer.score(p, None, "base") if slot is None else
                        scorer.score(p, lora_variant("m", slot["factors"], resident),
                                     merge_bench.content_key(slot["factors"])))
    scores = {n: merge_bench.normalised(profiles[n], served[n]) for n in profiles}
    rows.append({"order": row["order"], "slots": row["slots"], "method": "zenedge@0.7 (2026-11-30 decisions)",
                 "S": sum(scores.values()) / len(scores), "scores": scores, "served": served,
                 "seconds_per_arrival": row["seconds_per_arrival"], "arrival_seconds": row.get("arrival_seconds", []),
                 "peak_rss_mb": 0, "actions": row["actions"]})
    print(f"order {row['order']} K={row['slots']} S={merge_bench.clipped_mean(scores):.3f} clipped "
          f"(table: {merge_bench.clipped_mean(row['scores']):.3f})", flush=True)
result = {"profiles": [{"name": p.name, "metric": p.metric, "base": p.base, "own": p.own} for p in profiles.values()],
          "rows": rows, "examples": 16}
Path(sys.argv[1]).write_text(json.dumps(result, indent=2, default=str))
print(merge_bench.table(result))
