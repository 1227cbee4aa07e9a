"""Probe (issue [T]): 64-token decodes of the default base, auto against ZENEDGE_THREADS=1, 6 rounds
interleaved, with N busy processes. usage: ZENEDGE_HOME=... python ... N"""
import os, time, sys
from dataclasses import replace
import torch
from zenedge.store import Store
from zenedge.config import load
from zenedge.runtime.engine import Engine
from zenedge.runtime import threads
from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
from zenedge.bench.load import background_load
e = Engine(Store(os.environ["ZENEDGE_HOME"]), load())
r = replace(e.resident("smollm2-135m"), eos_ids=(-1,))
ids = list(range(1000, 1016))
def dec():
    t0, first = time.perf_counter(), None
    for _ in generate(r, [GenerationRequest(ids, None, SamplingParams(max_tokens=64))]):
        first = first or time.perf_counter()
    return 63 / (time.perf_counter() - first)
with background_load(int(sys.argv[1])):
    time.sleep(1)
    res = {"auto": [], "1": []}
    for i in range(6):
        for s in ("auto", 1):
            threads.configure(s); dec()
            res[str(s)].append(dec())
print({k: [round(x) for x in v] for k, v in res.items()})
