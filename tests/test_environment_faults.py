"""Faults of the machine, met as a user meets them: a read-only home, a full disk, a damaged index,
a FIFO or a huge file where an adapter or an eval set should be. Each is one `error:` line with its
documented exit code, from the CLI in-process and through the daemon, and the pool is unchanged."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.faults import fill_disk, mounted, one_error_line
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


def damage_blob(home: Path, name: str) -> None:
    from zenedge.store import Store

    store = Store(home)
    blob = store.blob_path(store.resolve(name)["sha256"])
    store.close()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_full_disk_while_the_default_base_is_converted_is_one_line(tmp_path):
    """Regression: the first `pull` converts the default base (GGUF → fp32 safetensors, ~540 MB)
    into the store; on a full disk safetensors' own SafetensorError escaped the classification: a
    traceback in-process, "internal error in the zenedge daemon" and exit 1 through it. Both are
    exit 74 in one line now, and no half-written base is registered or left behind."""
    from tests.server.harness import DEFAULT_CONFIG, write_config

    config_path = tmp_path / "config.toml"
    write_config(config_path, DEFAULT_CONFIG)     # the default registry: `writer` is on the default base
    with mount(["-t", "tmpfs", "-o", "size=40m", "tmpfs"], tmp_path / "small") as small:
        home = small / "home"
        env = {"ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "XDG_RUNTIME_DIR": "",
               "ZENEDGE_KEEP_ALIVE": "0", "ZENEDGE_THREADS": "1"}

        def consistent() -> None:
            assert run_cli("pool", "check", env=env, check=True).stdout == "ok: the pool is consistent\n"
            assert "no bases yet" in run_cli("base", "list", env=env, check=True).stdout
            # nothing staged is left (a live store's own staging directory stays, empty: owners.py)
            assert not [p for p in (home / "tmp").rglob("*") if not p.is_dir()]
            assert not list((home / "bases").iterdir())

        one_line(run_cli("pull", "writer", env=env), 74, "no space left on the disk")
        consistent()
        with one_torch_thread():
            daemon = ThreadDaemon.start(home, config_path)
            try:
                one_line(run_cli("pull", "writer", env=env), 74, "no space left on the disk")
                with daemon.uds(timeout=10) as http:
                    assert http.get("/health").status_code == 200
            finally:
                daemon.stop()
        consistent()


def test_reads_work_in_process_on_a_disk_full_to_the_last_byte(home, tmp_path):
    """Regression: with no free byte, SQLite cannot make the 32 KiB -shm file a WAL index needs, so
    `list`, `run` and `pool check` failed in-process with "disk I/O error" (a daemon that had the
    index open still answered). Reads need no space now; a write still fails in one line."""
    real, _, env = home
    with mount(["-t", "tmpfs", "-o", "size=8m", "tmpfs"], tmp_path / "small") as small:
        shutil.copytree(real, small / "home")
        env = {**env, "ZENEDGE_HOME": str(small / "home")}
        filler = fill_disk(small)
        assert shutil.disk_usage(small).free == 0
        listed = run_cli("list", "--json", env=env, check=True)
        assert '"name": "p0"' in listed.stdout
        assert run_cli("pool", "check", env=env, check=True).stdout == "ok: the pool is consistent\n"
        assert run_cli("pool", "status", env=env, check=True).stdout.startswith("budget ")
        assert run_cli("run", "p0", "hi", "--max-tokens", "3", env=env, check=True).stdout.strip()
        one_line(run_cli("rm", "p0", env=env), 74, "no space left")
        filler.unlink()
        assert run_cli("pool", "check", env=env, check=True).stdout == "ok: the pool is consistent\n"
        assert '"name": "p0"' in run_cli("list", "--json", env=env, check=True).stdout


def test_pool_check_that_finds_damage_exits_65_in_one_line(home):
    """Regression: `pool check` exited 1 on a damaged pool, where the README's exit table says 65
    (damaged data). The problems stay listed on stdout; stderr has the one `error:` line."""
    real, _, env = home
    damage_blob(real, "p1")
    checked = run_cli("pool", "check", env=env)
    one_line(checked, 65, "the pool check found 1 problem")
    assert "problem: the stored adapter of 'p1' is damaged" in checked.stdout
    as_json = run_cli("pool", "check", "--json", env=env)
    one_line(as_json, 65, "in the JSON")
    assert '"ok": false' in as_json.stdout


def test_a_failed_export_leaves_nothing_it_created(home, tmp_path):
    """Regression: an export that failed part way (here: p1's stored adapter is damaged, after p0
    was written) left its destination folder behind. A folder it made goes; one that was there
    keeps what it held before, and nothing the export added."""
    real, _, env = home
    damage_blob(real, "p1")
    new = tmp_path / "new" / "exports"
    one_line(run_cli("export", str(new), "p0", "p1", env=env), 65, "'p1' is damaged")
    assert not (tmp_path / "new").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    one_line(run_cli("export", str(mine), "p0", "p1", env=env), 65, "'p1' is damaged")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "kept"
    assert run_cli("export", str(new), "p0", env=env, check=True).returncode == 0   # the undamaged one exports
    assert (new / "p0" / "adapter_model.safetensors").is_file()


def test_a_fifo_as_the_adapters_weights_is_refused_at_once(home, tmp_path, lora_factory):
    """Regression: a FIFO named adapter_model.safetensors in an adapter directory was reported as
    "no adapter_model.safetensors". It is refused as not a regular file, exit 2, before the default
    base's first-use set-up (no --base here) and without opening it (which would block)."""
    real, _, env = home
    adapter = lora_factory(seed=13)
    (adapter / "adapter_model.safetensors").unlink()
    os.mkfifo(adapter / "adapter_model.safetensors")
    started = time.monotonic()
    for args in (["--base", "tiny"], []):
        one_line(run_cli("import", str(adapter), "--name", "x", *args, env=env), 2,
                 "adapter_model.safetensors is a FIFO, not a regular file")
    assert time.monotonic() - started < 60
    assert "x" not in run_cli("list", env=env, check=True).stdout
    bases = json.loads(run_cli("base", "list", "--json", env=env, check=True).stdout)
    assert sorted(b["name"] for b in bases) == ["forever", "tiny"]    # the default base was not set up
