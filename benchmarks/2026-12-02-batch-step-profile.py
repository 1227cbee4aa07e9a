"""Where a decode step of 8 base rows goes, 2026-12-02 (issue [O]), on the kernels of a0fc554 (one chain
of dot products per row): cProfile of one 64-token generate() of 8 rows on the default base, int4,
one thread, after a warm-up. Usage: python benchmarks/2026-12-02-batch-step-profile.py. Output:
the .txt beside."""
import cProfile, pstats, dataclasses, time, torch, io
from zenedge.bench.throughput import resolve_base, PROMPT
from zenedge.runtime import threads
from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
from zenedge.runtime.prompts import encode_chat
from zenedge.runtime.model import load_resident
threads.configure(1)
base_dir, _, _ = resolve_base(None, print)
r = dataclasses.replace(load_resident("b", base_dir, torch.device("cpu"), torch.float32, "int4"), eos_ids=(-1,))
prompt = encode_chat(r.tokenizer, PROMPT)
reqs = [GenerationRequest(prompt, None, SamplingParams(max_tokens=64)) for _ in range(8)]
for _ in generate(r, reqs): pass
pr = cProfile.Profile(); pr.enable()
for _ in generate(r, reqs): pass
pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18); print(s.getvalue()[:5000])
