"""Random sequences of import / rm / pin / budget set never breach B and keep index and blobs consistent."""

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.conftest import tiny_module_shapes, write_lora_dir
from zenedge import bases, config, pool
from zenedge.errors import AdapterNotFound, BudgetExceeded, InvalidInput
from zenedge.store import Store

NAMES = ["writer", "coder", "arith", "units", "jsonx"]


def make_machine(tiny_base_dir: Path):
    shapes = tiny_module_shapes(tiny_base_dir)
    source = Path(tempfile.mkdtemp(prefix="lora-variants-"))
    variants = [write_lora_dir(source / f"v{i}", shapes, rank=2 + 2 * (i % 3), seed=i) for i in range(6)]

    class PoolMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.root = Path(tempfile.mkdtemp(prefix="zenedge-prop-"))
            self.config_path = self.root / "config.toml"
            self.store = Store(self.root / "home")
            bases.add_hf_dir(self.store, tiny_base_dir, "tiny")

        def teardown(self):
            self.store.close()
            shutil.rmtree(self.root, ignore_errors=True)

        @property
        def cfg(self):
            return config.load(self.config_path)

        @rule(name=st.sampled_from(NAMES), variant=st.integers(0, len(variants) - 1))
        def import_adapter(self, name, variant):
            try:
                pool.import_lora(self.store, self.cfg, variants[variant], name, base="tiny")
            except BudgetExceeded:
                pass

        @rule(name=st.sampled_from(NAMES))
        def remove(self, name):
            try:
                self.store.remove_name(name)
            except AdapterNotFound:
                pass

        @rule(name=st.sampled_from(NAMES), pinned=st.booleans())
        def pin(self, name, pinned):
            try:
                self.store.set_pinned(name, pinned)
            except AdapterNotFound:
                pass

        @rule(budget=st.integers(0, 120_000))
        def set_budget(self, budget):
            try:
                pool.set_budget(self.store, self.cfg, f"{budget}B")
            except (BudgetExceeded, InvalidInput):  # 0 B is refused before anything changes
                pass

        @invariant()
        def consistent_and_within_budget(self):
            assert self.store.check(budget=self.cfg.budget) == []
            assert self.store.used_bytes() <= self.cfg.budget
            assert self.store.usage().adapters <= self.cfg.pool.max_adapters

    return PoolMachine


def test_random_operation_sequences_keep_the_invariants(tiny_base_dir):
    machine = make_machine(tiny_base_dir)
    machine.TestCase.settings = settings(max_examples=25, stateful_step_count=15, deadline=None,
                                         suppress_health_check=list(HealthCheck))
    machine.TestCase().runTest()
