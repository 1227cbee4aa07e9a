"""Owned temporary files: clean-up removes what a dead process left and never what a live one uses."""

import os
import signal
import subprocess
import sys
import threading

from tests.conftest import REPO
from zenedge.store import Store
from zenedge.store.owners import Downloads, staging_leftovers

HOLDER = r"""
import sys, time
from pathlib import Path
from zenedge.store import Store
store = Store(Path(sys.argv[1]))
(store.blobs.tmp / "work").write_bytes(b"staged")
print(store.blobs.tmp, flush=True)
time.sleep(600)
"""


def start_holder(home):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(home)], stdout=subprocess.PIPE, text=True, env=env)
    return proc, proc.stdout.readline().strip()


def test_a_live_process_keeps_its_staging_and_a_killed_one_leaves_it_to_clean_up(isolated_home):
    store = Store(isolated_home)
    proc, staged = start_holder(isolated_home)
    try:
        assert (staged and os.path.isdir(staged)), staged
        assert staging_leftovers(store.blobs.tmp_root) == []
        assert store.reconcile(blocking=True)["tmp"] == 0  # an explicit gc leaves it alone too
        assert os.path.exists(os.path.join(staged, "work"))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert [str(p) for p in staging_leftovers(store.blobs.tmp_root)] == [staged]
    assert store.check() and Store(isolated_home).check() == []  # start-up collects it
    assert not os.path.exists(staged)


def test_staging_goes_with_its_store(isolated_home):
    store = Store(isolated_home)
    staged = store.blobs.tmp
    del store
    import gc

    gc.collect()
    assert not staged.exists()


def test_a_second_claim_waits_for_the_first(tmp_path):
    downloads = Downloads(tmp_path)
    digest = "ab" * 32
    order = []
    waited = threading.Event()

    def second():
        with Downloads(tmp_path).claim([digest], on_wait=lambda d: waited.set()):
            order.append("second")

    with downloads.claim([digest, "cd" * 32]):
        downloads.part(digest).write_bytes(b"half a file")
        thread = threading.Thread(target=second)
        thread.start()
        assert waited.wait(30)
        assert downloads.collect() == (0, 0)  # owned: not collected
        assert downloads.list()[0].active
        order.append("first")
    thread.join(30)
    assert order == ["first", "second"]
    assert [p.name for p in tmp_path.joinpath("partial").iterdir()] == [f"{digest}.part"]  # lock files go
    [left] = downloads.list()
    assert not left.active and left.bytes == len(b"half a file")
    assert downloads.collect() == (1, len(b"half a file"))
    assert list(tmp_path.joinpath("partial").iterdir()) == []
