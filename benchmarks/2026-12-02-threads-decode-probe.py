"""Probe (issue [T]): time to the first token and decode tokens/s of one request, with torch's default
threads (0) or one (1), for a profile or the base. usage: ZENEDGE_HOME=... python ... 0|1 [NAME]"""
import sys, time, os, torch
from zenedge.store import Store
from zenedge.config import load
from zenedge.runtime.engine import Engine, Prompt
from zenedge.runtime.generate import SamplingParams
th = int(sys.argv[1]) if len(sys.argv) > 1 else 0
name = sys.argv[2] if len(sys.argv) > 2 else "writer"
if th: torch.set_num_threads(th)
eng = Engine(Store(os.environ["ZENEDGE_HOME"]), load())
p = Prompt(messages=[{"role":"user","content":"Count from 1 to 200, separated by commas."}])
sp = SamplingParams(max_tokens=128)
list(eng.stream(name, p, sp))
for r in range(3):
    t=time.perf_counter(); n=0
    for d in eng.stream(name, p, sp):
        if n==0: t1=time.perf_counter()
        n+=1
    dt=time.perf_counter()-t1
    print(f"{name} threads={torch.get_num_threads()} first {t1-t:.3f}s, decode {(n-1)/dt:.1f} tok/s ({n})")
