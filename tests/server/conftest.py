"""Daemon fixtures: one in-thread daemon per module for read-only tests, fresh ones for tests that
change the pool or the config."""

from __future__ import annotations

import json

import pytest

from tests.conftest import tiny_module_shapes, write_lora_dir
from tests.server.harness import ThreadDaemon, make_home, one_torch_thread, write_config


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, tiny_base_dir):
    """A daemon over a home with the tiny base and four LoRA profiles p0..p3 (do not change its pool)."""
    running = ThreadDaemon.start(*make_home(tmp_path_factory.mktemp("daemon"), tiny_base_dir))
    yield running
    running.stop()


@pytest.fixture
def openai_client(daemon):
    """The official openai client on the module's daemon."""
    import openai

    return openai.OpenAI(base_url=f"{daemon.tcp_url}/v1", api_key=daemon.token, max_retries=0)


@pytest.fixture
def ollama_client(daemon):
    """The official ollama client on the module's daemon."""
    import ollama

    return ollama.Client(host=daemon.tcp_url, headers={"Authorization": f"Bearer {daemon.token}"})


@pytest.fixture
def fresh_daemon(tmp_path, tiny_base_dir):
    """Start a daemon of its own (keyword arguments go to make_home)."""
    started = []

    def start(**home_options) -> ThreadDaemon:
        running = ThreadDaemon.start(*make_home(tmp_path / f"d{len(started)}", tiny_base_dir, **home_options))
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


@pytest.fixture
def registry(tmp_path, tiny_base_dir):
    """A file:// registry with one LoRA profile, `writer`, for the tiny base."""
    from zenedge.bases import weights_sha256
    from zenedge.registry.builder import build_registry

    root = tmp_path / "registry"
    write_lora_dir(root / "writer" / "adapter", tiny_module_shapes(tiny_base_dir), seed=11, scale=0.3)
    (root / "writer" / "recipe.json").write_text(json.dumps({
        "name": "writer", "version": "1.0.0", "description": "test writer", "kind": "lora",
        "base": {"name": "tiny", "sha256": weights_sha256(tiny_base_dir)}}))
    build_registry(root)
    return f"file://{root}"


@pytest.fixture(scope="module")
def real_daemon(tmp_path_factory, real_base_dir):
    """A daemon on the real default base (SmolLM2-135M-Instruct), float32 on the CPU."""
    from zenedge import bases
    from zenedge.digests import file_sha256
    from zenedge.store import Store

    root = tmp_path_factory.mktemp("real-daemon")
    home, config_path = root / "home", root / "config.toml"
    write_config(config_path, {"runtime": {"device": "cpu", "dtype": "float32", "weights": "full"}})
    store = Store(home)
    bases.add_hf_dir(store, real_base_dir, bases.DEFAULT_BASE, aliases=bases.DEFAULT_BASE_ALIASES,
                     sha256=file_sha256(bases.default_base_gguf()))
    store.close()
    with one_torch_thread():
        running = ThreadDaemon.start(home, config_path)
        yield running
        running.stop()
