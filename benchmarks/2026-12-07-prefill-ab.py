# Run from the repository root with ZENEDGE_HOME/ZENEDGE_CONFIG set: python benchmarks/2026-12-07-prefill-ab.py BASE TOKENS ROUNDS COUNTS (e.g. s17-q4-0 512 2 1,2).
"""Prefill tok/s of one ~N-token prompt at thread counts, interleaved, one process (time to the first token)."""
import sys, time
from zenedge import config, paths
from zenedge.store.store import Store
from zenedge.runtime.engine import Engine, Prompt
from zenedge.runtime.sampling import SamplingParams
from zenedge.runtime import threads
base, target, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
counts = [int(c) for c in sys.argv[4].split(",")]
engine = Engine(Store(paths.home()), config.load())
sentence = "The keeper climbed the stairs at dusk and lit the lamp for the ships. "
params = SamplingParams(max_tokens=1, temperature=0.0)
def prompt_of(sentences):
    return Prompt(messages=[{"role": "user", "content": sentence * sentences}])
def run(count, sentences):
    policy = threads.configure(count or "auto")   # what the config's runtime.threads gives
    if not count:                        # let "auto" take its first reading of the load
        policy.wide(); time.sleep(0.3)
    start = time.perf_counter()
    for _ in engine.stream(base, prompt_of(sentences), params):
        break
    return time.perf_counter() - start
tokenizer = engine.resident(base).tokenizer
sentences, n = 1, len(prompt_of(1).encode(tokenizer))
while n < target:                        # the fewest sentences whose chat template reaches `target` tokens
    sentences += 1
    n = len(prompt_of(sentences).encode(tokenizer))
print(f"prompt: {n} tokens", flush=True)
run(1, 2)                                # warm-up
for r in range(rounds):
    for c in counts:
        dt = run(c, sentences)
        print(f"round {r} threads {c or 'auto'}: {n} tokens in {dt:.2f} s = {n / dt:.1f} tok/s", flush=True)
