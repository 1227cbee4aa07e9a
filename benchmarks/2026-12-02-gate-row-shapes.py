"""A gate row by matmul shape (1 thread): 48 rows of units, writer and jsonx on their own registry
adapters, scored twice by QualityGate.score, then once under torch.profiler grouped by input shape.
The output head ([answer tokens, 576] x [576, 49152], fp32) is the second line. Output beside it (.txt).
Run with ZENEDGE_HOME set to a home holding the default base, and any argument to profile."""
import time, json, sys
import torch
from pathlib import Path
from zenedge.adapters.lora_tensors import read_lora_factors
from zenedge.cli.context import load_config, open_store
from zenedge.pool.gate import QualityGate
from zenedge.runtime.engine import Engine
from zenedge.runtime.variants import lora_variant
torch.set_num_threads(1)
store, cfg = open_store(), load_config()
resident = Engine(store, cfg, scoring_only=True).resident("smollm2-135m")
gate = QualityGate(resident)
rows = []
for name in ("units", "writer", "jsonx"):
    adapter = Path("profiles") / name / "adapter"
    factors = read_lora_factors(adapter / "adapter_model.safetensors",
                                json.loads((adapter / "adapter_config.json").read_text()), dtype=torch.float32)
    variant = lora_variant(name, factors, resident)
    rows += [(variant, e) for e in gate.encoded(Path("profiles") / name / "eval.jsonl")[1][:16]]
gate.score(rows[:4])
for _ in range(2):
    start = time.perf_counter(); gate.score(rows); took = time.perf_counter() - start
    print(f"{len(rows)} rows: {took:.2f} s, {took / len(rows):.3f} s per row")
if len(sys.argv) > 1:
    from torch.profiler import profile
    with profile(record_shapes=True) as prof:
        gate.score(rows)
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=30, max_shapes_column_width=60))
