"""SIGKILL a process at random instants while it imports, removes, evicts and collects: the pool
must stay consistent (only leftovers that start-up removes), be fully clean after reconcile, and
lose no profile that was not removed by a committed operation (see crash_worker.py)."""

import random

from tests.conftest import tiny_module_shapes, write_lora_dir
from tests.store.crash_worker import LIGHT_OPS, kill_and_check
from zenedge import bases, config
from zenedge.store import Store


def test_sigkill_at_random_points_leaves_a_consistent_pool(tmp_path, tiny_base_dir, isolated_home):
    shapes = tiny_module_shapes(tiny_base_dir)
    variants = [str(write_lora_dir(tmp_path / f"v{i}", shapes, rank=2 + i, seed=i)) for i in range(4)]
    store = Store(isolated_home)
    bases.add_hf_dir(store, tiny_base_dir, "tiny")
    rng = random.Random(1234)
    for round_ in range(24):
        kill = kill_and_check(isolated_home, variants, round_, rng.uniform(0.0, 0.4), list(LIGHT_OPS),
                              lambda: config.load().budget, deep=False)
        assert kill.killed and kill.problems == [] and kill.lost == [], f"round {round_}: {kill}"
    assert store.events(1000), "the workers did real work"


def test_sigkill_while_adapters_are_stored_smaller_leaves_one_form_or_the_other(tmp_path, tiny_base_dir,
                                                                                   isolated_home):
    """Compression (pool/shrink.py) under `budget set`: a kill in the quantization, the gate or the
    commit leaves every profile served by its old adapter or its smaller one, never by neither."""
    shapes = tiny_module_shapes(tiny_base_dir)
    variants = [str(write_lora_dir(tmp_path / f"v{i}", shapes, rank=2 + i, seed=i, scale=0.3)) for i in range(4)]
    store = Store(isolated_home)
    bases.add_hf_dir(store, tiny_base_dir, "tiny")
    rng = random.Random(99)
    ops = []
    for round_ in range(6):
        kill = kill_and_check(isolated_home, variants, 500 + round_, rng.uniform(0.0, 1.0), ["compress", "import"],
                              lambda: config.load().budget, deep=False, target="compress")
        assert kill.killed and kill.problems == [] and kill.lost == [], f"round {round_}: {kill}"
        ops.append(kill.op)
    assert "compress" in ops
