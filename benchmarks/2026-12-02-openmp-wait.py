"""How OpenMP's idle workers wait, measured on the gate's kind of work (issue [T]).

The thread policy bounds libgomp's spin (GOMP_SPINCOUNT=30000) instead of making idle workers
sleep at once (OMP_WAIT_POLICY=passive). This script times one teacher-forced forward of the
default base on [8, 128] tokens with 1 and 2 torch threads under each setting, each in a fresh
process (the variables are read when OpenMP starts), rounds interleaved, and prints the best of
5 per cell.

    ZENEDGE_HOME=... python benchmarks/2026-12-02-openmp-wait.py > benchmarks/2026-12-02-openmp-wait.txt
"""

import json
import os
import subprocess
import sys

SETTINGS = {"libgomp default (spin 300000)": {}, "OMP_WAIT_POLICY=passive": {"OMP_WAIT_POLICY": "PASSIVE"},
            "GOMP_SPINCOUNT=30000 (zenedge)": {"GOMP_SPINCOUNT": "30000"}}
CHILD = r"""
import json, os, time, torch
from zenedge.config import load
from zenedge.runtime import threads
from zenedge.runtime.engine import Engine
from zenedge.store import Store
model = Engine(Store(os.environ["ZENEDGE_HOME"]), load(), scoring_only=True).resident("smollm2-135m").model
x = torch.randint(100, 5000, (8, 128), generator=torch.Generator().manual_seed(0))
out = {}
with torch.no_grad():
    for n in (1, 2):
        threads.configure(n)
        with threads.pace():
            model(input_ids=x)
            best = min(_t for _t in [(lambda t=time.perf_counter(): (model(input_ids=x), time.perf_counter() - t)[1])()
                                     for _ in range(5)])
        out[n] = best
print(json.dumps(out))
"""


def main() -> None:
    best: dict[str, dict[str, float]] = {label: {} for label in SETTINGS}
    for _ in range(2):
        for label, extra in SETTINGS.items():
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
            done = subprocess.run([sys.executable, "-c", CHILD], env={**env, **extra}, capture_output=True, text=True,
                                  check=True)
            for n, seconds in json.loads(done.stdout.strip().splitlines()[-1]).items():
                best[label][n] = min(best[label].get(n, seconds), seconds)
    print("| OpenMP wait | 1 thread, s | 2 threads, s | 2 threads vs 1 |")
    print("|---|---|---|---|")
    for label, cells in best.items():
        print(f"| {label} | {cells['1']:.2f} | {cells['2']:.2f} | {cells['1'] / cells['2']:.2f}× |")


if __name__ == "__main__":
    main()
