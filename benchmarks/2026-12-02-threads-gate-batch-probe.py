"""Probe (issue [T]): QualityGate.score on 48 rows (csvx, jsonx, writer × 8 examples × base/own),
best of 3, by mode (one: 1 thread; intra: torch's threads; lanes: map_lanes) and rows per batch.
usage: ZENEDGE_HOME=... GOMP_SPINCOUNT=30000 python ... one|intra|lanes LABEL BATCH"""
import os, sys, time, torch, json
from pathlib import Path
from zenedge.store import Store
from zenedge.config import load
from zenedge.runtime.engine import Engine
from zenedge.runtime import threads
from zenedge.runtime.variants import load_lora
from zenedge.pool import gate as gate_mod
mode = sys.argv[1]; label = sys.argv[2]
bs = int(sys.argv[3]) if len(sys.argv) > 3 else gate_mod.SCORE_BATCH
eng = Engine(Store(os.environ["ZENEDGE_HOME"]), load(), scoring_only=True)
res = eng.resident("smollm2-135m")
if mode == "intra":
    threads.map_lanes = lambda work, pieces: [work(p) for p in pieces]
    gate_mod.threads.map_lanes = threads.map_lanes
elif mode == "one":
    threads.map_lanes = lambda work, pieces: [work(p) for p in pieces]
    torch.set_num_threads(1); threads.policy().setting = 1; threads.policy().source = "probe"
prof = Path("/work/main/profiles")
g = gate_mod.QualityGate(res, batch_size=bs)
rows = []
for name in ("csvx", "jsonx", "writer"):
    cfg = json.loads((prof / name / "adapter/adapter_config.json").read_text())
    v = load_lora(name, "lora", prof / name / "adapter/adapter_model.safetensors", cfg, res.device, res.dtype)
    _, ex = g.encoded(prof / name / "eval.jsonl")
    rows += [(var, e) for e in ex[:8] for var in (None, v)]
g.score(rows[:8])
best = []
for r in range(3):
    t = time.perf_counter(); g.score(rows); best.append(time.perf_counter() - t)
print(f"{label} {mode} batch={bs} rows={len(rows)}: {min(best):.2f}s (runs {', '.join(f'{b:.2f}' for b in best)})", flush=True)
