"""Where a CLI merging pull's fixed time and a gate row's time go (1 thread), measured in one
process on the store's default base: the imports and base load a fresh `zenedge pull` pays before
the gate reads a row, then 48 gate rows (16 examples each of units, writer and jsonx on their own
registry adapters) scored twice by `QualityGate.score`, and once under torch.profiler (top ops by
self time). Prints a plain-text report; the committed output is beside it (.txt)."""
import time

t0 = time.perf_counter()
import torch  # noqa: E402

t1 = time.perf_counter()
import transformers  # noqa: E402, F401

t2 = time.perf_counter()
import transformers.models.llama.modeling_llama  # noqa: E402, F401

t3 = time.perf_counter()
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from zenedge.adapters.lora_tensors import read_lora_factors  # noqa: E402
from zenedge.cli.context import load_config, open_store  # noqa: E402
from zenedge.pool.gate import QualityGate  # noqa: E402
from zenedge.runtime.engine import Engine  # noqa: E402
from zenedge.runtime.variants import lora_variant  # noqa: E402

torch.set_num_threads(1)
store, cfg = open_store(), load_config()
t4 = time.perf_counter()
resident = Engine(store, cfg, scoring_only=True).resident("smollm2-135m")
t5 = time.perf_counter()
print(f"import torch {t1 - t0:.2f} s, transformers {t2 - t1:.2f} s, modeling_llama {t3 - t2:.2f} s, "
      f"base load (tokenizer, model, patch) {t5 - t4:.2f} s")

gate = QualityGate(resident)
rows = []
for name in ("units", "writer", "jsonx"):
    adapter = Path("profiles") / name / "adapter"
    factors = read_lora_factors(adapter / "adapter_model.safetensors",
                                json.loads((adapter / "adapter_config.json").read_text()), dtype=torch.float32)
    variant = lora_variant(name, factors, resident)
    rows += [(variant, e) for e in gate.encoded(Path("profiles") / name / "eval.jsonl")[1][:16]]
tokens = sum(len(e.prompt_ids) + len(e.answer_ids) for _, e in rows)
gate.score(rows[:4])  # warm-up
for _ in range(2):
    start = time.perf_counter()
    gate.score(rows)
    took = time.perf_counter() - start
    print(f"{len(rows)} rows, {tokens} tokens: {took:.2f} s, {took / len(rows):.3f} s per row")
from torch.profiler import profile  # noqa: E402

with profile() as prof:
    gate.score(rows)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
