"""First token (the prefill, then one step) of the default base and of one packed BitDelta row on the
same prompt, through the runtime's generate loop; one thread, rounds interleaved, medians. Run from
the repository root: python -m tools.first_token_bitdelta."""
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
r = dataclasses.replace(load_resident("b", base_dir, cpu, torch.float32, "int4"), eos_ids=(-1,))
bd = load_bitdelta("d", f, cpu)
prompt = encode_chat(r.tokenizer, PROMPT)
def first_token(v):
    t = time.perf_counter()
    for _ in generate(r, [GenerationRequest(prompt, v, SamplingParams(max_tokens=1))]): pass
    return (time.perf_counter() - t) * 1e3
for v in (None, bd): first_token(v)
res = {"base": [], "bitdelta": []}
for _ in range(7):
    for name, v in (("base", None), ("bitdelta", bd)):
        res[name].append(first_token(v))
print(f"prompt: {len(prompt)} tokens")
for k, v in res.items(): print(k, [round(x, 1) for x in v], "median ms", round(statistics.median(v), 1))
print("bitdelta - base, median of per-round differences, ms:",
      round(statistics.median(b - a for a, b in zip(res["base"], res["bitdelta"])), 1))
