"""SIGKILL a process at random instants while it imports, removes, evicts and collects: the pool
must stay consistent (only leftovers that start-up removes), and be fully clean after reconcile."""

import os
import random
import signal
import subprocess
import sys
import time

from tests.conftest import REPO, tiny_module_shapes, write_lora_dir
from zenedge import bases, config
from zenedge.store import Store

WORKER = r"""
import random, sys
from pathlib import Path
from zenedge import config, policy
from zenedge.errors import ZenedgeError
from zenedge.store import Store

home, variants, seed = Path(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
rng = random.Random(seed)
store = Store(home)
print("ready", flush=True)
names = ["a", "b", "c", "d"]
while True:
    cfg = config.load()
    op = rng.random()
    try:
        if op < 0.5:
            policy.import_lora(store, cfg, Path(rng.choice(variants)), rng.choice(names), base="tiny")
        elif op < 0.7:
            store.remove_name(rng.choice(names))
        elif op < 0.9:
            policy.set_budget(store, cfg, f"{rng.randint(20_000, 120_000)}B")
        else:
            store.reconcile()
    except ZenedgeError:
        pass
"""

ALLOWED_BEFORE_RECONCILE = ("orphan blob", "leftover temporary file")


def test_sigkill_at_random_points_leaves_a_consistent_pool(tmp_path, tiny_base_dir, isolated_home):
    shapes = tiny_module_shapes(tiny_base_dir)
    variants = [str(write_lora_dir(tmp_path / f"v{i}", shapes, rank=2 + i, seed=i)) for i in range(4)]
    store = Store(isolated_home)
    bases.add_hf_dir(store, tiny_base_dir, "tiny")
    rng = random.Random(1234)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    kills = 0
    for round_ in range(24):
        proc = subprocess.Popen([sys.executable, "-c", WORKER, str(isolated_home), ",".join(variants), str(round_)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += proc.returncode == -signal.SIGKILL
        budget = config.load().budget
        problems = Store(isolated_home, reconcile=False).check(budget=budget)
        unexpected = [p for p in problems if not p.startswith(ALLOWED_BEFORE_RECONCILE)]
        assert unexpected == [], f"round {round_}: {unexpected}"
        assert Store(isolated_home).check(budget=budget) == [], f"round {round_}: not clean after reconcile"
    assert kills == 24
    assert store.events(1000), "the workers did real work"
