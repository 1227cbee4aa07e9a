"""Probe (issue [T]): 4 teacher-forced [4, 128] batches of the default base, bf16 autocast, on one
thread, torch's two threads, or two lanes of one thread each. Run quiet, then beside `while :; do :; done`.
usage: ZENEDGE_HOME=... python benchmarks/2026-12-02-threads-lanes-probe.py quiet|busy"""
import os, sys, time, torch, threading
from concurrent.futures import ThreadPoolExecutor
from zenedge.store import Store
from zenedge.config import load
from zenedge.runtime.engine import Engine
eng = Engine(Store(os.environ["ZENEDGE_HOME"]), load(), scoring_only=True)
m = eng.resident("smollm2-135m").model
xs = [torch.randint(100, 5000, (4, 128)) for _ in range(4)]
def run(x, n):
    torch.set_num_threads(n)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        m(input_ids=x)
pool = ThreadPoolExecutor(2)
def lanes(): list(pool.map(lambda x: run(x, 1), xs))
def intra(): [run(x, 2) for x in xs]
def one(): [run(x, 1) for x in xs]
res = {}
for name, f in [("one", one), ("intra2", intra), ("lanes2", lanes)] * 2:
    f(); t = time.perf_counter(); f(); res.setdefault(name, []).append(time.perf_counter() - t)
print(sys.argv[1], {k: f"{min(v):.2f}s" for k, v in res.items()})
