"""Faults of the machine, met as a user meets them: a read-only home, a full disk, a damaged index,
a FIFO or a huge file where an adapter or an eval set should be. Each is one `error:` line with its
documented exit code, from the CLI in-process and through the daemon, and the pool is unchanged."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.faults import mounted, one_error_line
from tests.server.harness import ThreadDaemon, make_home, one_torch_thread


@contextlib.contextmanager
def mount(args: list[str], target: Path):
    """A mount for the test's life (root only: skipped where the sandbox does not allow it)."""
    with mounted(args, target) as where:
        if where is None:
            pytest.skip("mounts are not allowed here")
        yield where


def one_line(done: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert one_error_line(done, code), (done.returncode, done.stderr)
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr


@pytest.fixture
def home(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    env = {"ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "XDG_RUNTIME_DIR": "",
           "ZENEDGE_KEEP_ALIVE": "0", "ZENEDGE_THREADS": "1"}
    return home, config_path, env


def test_a_read_only_home_reads_and_refuses_writes_in_one_line(home, tmp_path, lora_factory):
    real, _, env = home
    with mount(["--bind", str(real)], tmp_path / "view") as view:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        env = {**env, "ZENEDGE_HOME": str(view)}
        listed = run_cli("list", "--json", env=env, check=True)
        assert '"name": "p0"' in listed.stdout
        assert run_cli("budget", "show", env=env, check=True).stdout.startswith("budget ")
        assert run_cli("pool", "check", env=env, check=True).stdout == "ok: the pool is consistent\n"
        ran = run_cli("run", "p0", "hi", "--max-tokens", "3", env={**env, "ZENEDGE_KEEP_ALIVE": "60"}, check=True)
        assert "no zenedge daemon can start here" in ran.stderr
        for args in (["rm", "p0"], ["pin", "p0"], ["budget", "set", "1GB"],
                     ["import", str(lora_factory(seed=9)), "--name", "new", "--base", "tiny"]):
            one_line(run_cli(*args, env=env), 77, "not writable", str(view))
        one_line(run_cli("serve", env=env), 77, "read-only file system")


def test_a_full_disk_is_one_line_and_the_pool_stays_consistent(home, tmp_path, lora_factory, tiny_base_dir):
    real, config_path, env = home
    with mount(["-t", "tmpfs", "-o", "size=8m", "tmpfs"], tmp_path / "small") as small:
        shutil.copytree(real, small / "home")
        env = {**env, "ZENEDGE_HOME": str(small / "home")}
        filler = small / "filler"
        with open(filler, "wb") as handle:                      # 1 MB left: room to open the pool, not the margin
            handle.write(bytes(shutil.disk_usage(small).free - (1 << 20)))
        one_line(run_cli("import", str(lora_factory(seed=11)), "--name", "new", "--base", "tiny", env=env), 74,
                 "storing 'new' needs", "and a 64.0 MiB margin, but the disk holding")   # the check before writing
        with open(filler, "ab") as handle:                      # 20 kB left: any write meets the full disk
            handle.write(bytes(shutil.disk_usage(small).free - 20_000))
        for args in (["base", "add", str(tiny_base_dir), "--name", "copy"], ["rm", "p0"]):
            one_line(run_cli(*args, env=env), 74)
        filler.unlink()
        assert run_cli("pool", "check", env=env, check=True).stdout == "ok: the pool is consistent\n"
        listed = run_cli("list", env=env, check=True).stdout
        assert "p0" in listed and "new" not in listed


def test_fifos_and_huge_files_are_refused_at_once(home, tmp_path, lora_factory):
    _, _, env = home
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.jsonl"
    with open(huge, "wb") as handle:
        handle.truncate(2 << 30)                           # sparse: 2 GB that take no disk
    one_line(run_cli("import", str(fifo), "--name", "x", env=env), 2, "is a FIFO, not a regular file")
    adapter = str(lora_factory(seed=12))
    one_line(run_cli("import", adapter, "--name", "x", "--base", "tiny", "--eval", str(fifo), env=env), 2,
             "eval set", "is a FIFO")
    one_line(run_cli("import", adapter, "--name", "x", "--base", "tiny", "--eval", str(huge), env=env), 2,
             "has 2.0 GiB; at most 64.0 MiB is read")


def test_the_daemon_refuses_a_fifo_and_keeps_answering(home, tmp_path):
    real, config_path, _ = home
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with one_torch_thread():
        daemon = ThreadDaemon.start(real, config_path)
        try:
            with daemon.uds(timeout=10) as http:
                start = time.monotonic()
                refused = http.post("/api/import", json={"path": str(fifo), "name": "x", "stream": False})
                assert refused.status_code == 400 and "is a FIFO" in refused.json()["error"]["message"]
                assert time.monotonic() - start < 5
                assert http.get("/health", timeout=1).status_code == 200
        finally:
            daemon.stop()


def test_a_damaged_index_is_one_line_for_every_command(home):
    real, _, env = home
    index = real / "index.db"
    index.write_bytes(b"garbage" * 100)
    for suffix in ("-wal", "-shm"):
        index.with_name(index.name + suffix).unlink(missing_ok=True)
    for args in (["list"], ["budget", "show"], ["pool", "status"], ["pool", "check"], ["rm", "p0"],
                 ["run", "p0", "hi"], ["serve"]):
        one_line(run_cli(*args, env=env), 65, "index", "zenedge pool recover")
    assert len(list((real / "blobs").iterdir())) == 4        # nothing was deleted


def test_a_damaged_blob_through_the_daemon_is_one_error(home):
    real, config_path, _ = home
    from zenedge.store import Store

    store = Store(real)
    blob = store.blob_path(store.resolve("p1")["sha256"])
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    with one_torch_thread():
        daemon = ThreadDaemon.start(real, config_path)
        try:
            with daemon.uds() as http:
                answer = http.post("/v1/chat/completions",
                                   json={"model": "p1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                assert answer.status_code == 500
                assert answer.json()["error"]["code"] == "blob_damaged"
                assert "the stored adapter of 'p1' is damaged" in answer.json()["error"]["message"]
                assert http.post("/v1/chat/completions", json={"model": "p0", "max_tokens": 2,
                                 "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        finally:
            daemon.stop()
