"""Peak RSS of the quality gate's scoring at 1.7B, in one process: the base loaded, then 16 and 48
rows of a 50-example eval set scored (two lanes on this machine), with the losses' first values
(the same at every commit). Run it at two commits to compare (`git worktree`):

    ZENEDGE_HOME=HOME python benchmarks/2026-12-07-scoring-memory-probe.py BASE EVAL.jsonl
"""
import sys
import time
from pathlib import Path

from zenedge import config, paths
from zenedge.pool.gate import QualityGate
from zenedge.runtime.engine import Engine
from zenedge.store import Store


def peak(tag: str) -> None:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    print(f"{tag}: VmHWM {int(fields['VmHWM'].split()[0]) / 2**20:.2f} GiB, "
          f"VmRSS {int(fields['VmRSS'].split()[0]) / 2**20:.2f} GiB", flush=True)


engine = Engine(Store(paths.home()), config.load(paths.config_path()))
resident = engine.resident(sys.argv[1])
peak("loaded")
gate = QualityGate(resident)
_, examples = gate.encoded(Path(sys.argv[2]))
for count in (16, 48):
    start = time.perf_counter()
    scores = gate.score([(None, example) for example in examples[:count]])
    print(f"{count} rows in {time.perf_counter() - start:.1f} s; first losses "
          f"{[round(loss, 4) for loss, _ in scores[:3]]}")
    peak(f"scored {count}")
