"""What the registry tests share: a registry folder of tiny profiles for the `tiny` base."""

import pytest

from tests.conftest import tiny_module_shapes
from tests.registry.server import build_tiny_registry


@pytest.fixture
def registry_dir(tmp_path, tiny_base_dir, store):
    """A registry of three tiny profiles (two LoRA, one sharing weights) for the `tiny` base."""
    return build_tiny_registry(tmp_path / "registry", tiny_module_shapes(tiny_base_dir), store.base("tiny")["sha256"])
