# Run from the repository root with ZENEDGE_HOME/ZENEDGE_CONFIG set: python benchmarks/2026-12-07-threads-decode-ab.py BASE TOKENS ROUNDS COUNTS (e.g. s17-q4-0 48 2 1,2; 0 = auto).
"""A/B: decode tok/s of one base row at C-kernel threads 1 vs 2, interleaved, one process (first token excluded)."""
import sys, time
from zenedge import config, paths
from zenedge.store.store import Store
from zenedge.runtime.engine import Engine
from zenedge.runtime.engine import Prompt
from zenedge.runtime.sampling import SamplingParams
from zenedge.runtime import threads
base = sys.argv[1]; tokens = int(sys.argv[2]); rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
counts = [int(c) for c in (sys.argv[4] if len(sys.argv) > 4 else "1,2").split(",")]
cfg = config.load()
engine = Engine(Store(paths.home()), cfg)
prompt = Prompt(messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}])
params = SamplingParams(max_tokens=tokens, temperature=0.0)
def run(count):
    policy = threads.configure(count or "auto")   # what the config's runtime.threads gives
    if not count:                        # let "auto" take its first reading of the load
        policy.wide(); time.sleep(0.3)
    stamps = [time.perf_counter() for _ in engine.stream(base, prompt, params)]
    return len(stamps) - 1, stamps[-1] - stamps[0]
run(1)
for r in range(rounds):
    for count in counts:
        n, dt = run(count)
        print(f"round {r} threads {count or 'auto'} (decode {threads.policy().decide(True).threads}): {n} steps {n/dt:.1f} tok/s", flush=True)
