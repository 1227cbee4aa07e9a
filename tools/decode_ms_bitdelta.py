"""ms per decode token of the default base and of one packed BitDelta row (no dense copy), from
the runtime's own generate loop: (time of T tokens - time of 1 token) / (T - 1), so the prefill
cancels out (ROUNDS and T from the command line, default 9 and 129). One thread, rounds
interleaved, medians and the median of per-round ratios. Run from the repository root:
python -m tools.decode_ms_bitdelta [ROUNDS T]."""
import time, tempfile, dataclasses, statistics
from pathlib import Path
import torch
from zenedge.bench.throughput import resolve_base, PROMPT
from zenedge.bench.variants import make_bitdelta
from zenedge.runtime.variants import load_bitdelta
from zenedge.runtime import threads
from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
from zenedge.runtime.model import load_resident
from zenedge.runtime.prompts import encode_chat
threads.configure(1)
cpu = torch.device("cpu")
base_dir, _, _ = resolve_base(None)
w = Path(tempfile.mkdtemp())
f = make_bitdelta(base_dir, w, w / "d.bitdelta", seed=10)
r = load_resident("b", base_dir, cpu, torch.float32, "int4")
r = dataclasses.replace(r, eos_ids=(-1,))
bd = load_bitdelta("d", f, cpu)
prompt = encode_chat(r.tokenizer, PROMPT)
def timed(v, n):
    t = time.perf_counter()
    for _ in generate(r, [GenerationRequest(prompt, v, SamplingParams(max_tokens=n))]): pass
    return time.perf_counter() - t
for v in (None, bd): timed(v, 8)
res = {"base": [], "bd": []}
import sys
rounds, tokens = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (9, 129)
for _ in range(rounds):
    for name, v in (("base", None), ("bd", bd)):
        res[name].append((timed(v, tokens) - timed(v, 1)) / (tokens - 1) * 1e3)
print(f"{rounds} rounds of {tokens} tokens")
for k, v in res.items(): print(k, [round(x, 2) for x in v], "median ms/token", round(statistics.median(v), 2))
print("ratio", statistics.median(res["base"]) / statistics.median(res["bd"]))
print("median of per-round ratios", statistics.median(b / d for b, d in zip(res["base"], res["bd"])))
