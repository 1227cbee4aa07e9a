"""Daemon fixtures: one in-thread daemon per module for read-only tests, fresh ones for tests that
change the pool or the config."""

from __future__ import annotations

import pytest

from tests.server.harness import ThreadDaemon, make_home, one_torch_thread


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
