"""A live daemon with the tiny model for the desktop clients (one per module, in the test process)."""

from __future__ import annotations

import pytest

from tests.server.harness import ThreadDaemon, make_home, one_torch_thread


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, tiny_base_dir):
    with one_torch_thread():
        running = ThreadDaemon.start(*make_home(tmp_path_factory.mktemp("desktop-daemon"), tiny_base_dir))
        yield running
        running.stop()
