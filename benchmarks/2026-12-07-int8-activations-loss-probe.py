"""The quality gate's scoring on a stored base with the int4 kernel's inputs rounded to int16 and
to int8 (`runtime.activations`), on the embedded profiles' eval sets: mean answer loss per token,
teacher-forced argmax hits, and the largest per-example difference per answer token.

    ZENEDGE_HOME=HOME python benchmarks/2026-12-07-int8-activations-loss-probe.py [BASE]
"""
import sys
from pathlib import Path

from zenedge import config, paths
from zenedge.pool.gate import QualityGate
from zenedge.runtime import cpu_weights
from zenedge.runtime.engine import Engine
from zenedge.store import Store

ROOT = Path(__file__).resolve().parent.parent
engine = Engine(Store(paths.home()), config.load(paths.config_path()))
resident = engine.resident(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m")
gate = QualityGate(resident)
print(f"base {resident.name}, weights {resident.weights}")
print("eval set | examples | loss int16 | loss int8 | change | hits int16 / int8 | worst example, nats per token")
for eval_path in sorted(ROOT.glob("profiles/*/eval.jsonl")):
    _, examples = gate.encoded(eval_path)
    read = {}
    for setting in ("int16", "int8"):
        cpu_weights.set_activations(setting)
        read[setting] = gate.score([(None, example) for example in examples])
    cpu_weights.set_activations("int16")
    tokens = sum(len(example.answer_ids) for example in examples)
    loss = {setting: sum(total for total, _ in rows) / tokens for setting, rows in read.items()}
    hits = {setting: sum(hit for _, hit in rows) for setting, rows in read.items()}
    worst = max(abs(a[0] - b[0]) / max(1, len(example.answer_ids))
                for a, b, example in zip(read["int16"], read["int8"], examples))
    print(f"{eval_path.parent.name} | {len(examples)} | {loss['int16']:.4f} | {loss['int8']:.4f} | "
          f"{loss['int8'] / loss['int16'] - 1:+.2%} | {hits['int16']} / {hits['int8']} | {worst:.3f}")
