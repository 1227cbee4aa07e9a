"""Fault injection, end to end: kill pool writers and the daemon at random moments, fire bad input
at the CLI and the HTTP API, hold concurrent streams, then check that nothing was lost.

    python -m tests.faults                       # the full run (minutes), table + JSON
    python -m tests.faults --out FILE.json       # also write the figures (benchmarks/DATE-faults.json)
    python -m tests.faults --quick               # the small version tests/test_faults.py runs

Everything is real: a tiny random llama as the base, LoRA profiles, a throttled HTTP registry on
127.0.0.1 (so a kill can land mid-download), `zenedge serve` processes, the CLI as subprocesses.
"Nothing lost", after every kill: before any repair only leftovers that start-up removes; after
start-up's reconcile a deep check (every blob re-hashed) finds nothing and the budget holds; no
profile vanished without a committed rm/evict (tests/store/crash_worker.py). A bad input is
refused correctly when it gets its documented status (CLI: exit code and one `error:` line; HTTP:
status and the `{"error": {"code", "message"}}` body), no traceback, and the pool is unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.conftest import make_tiny_base, run_cli, tiny_module_shapes, write_lora_dir
from tests.registry.server import build_tiny_registry, serve_registry
from tests.server.harness import DEFAULT_CONFIG, PROFILES, ProcessDaemon, chat_body, make_home, stream_text, write_config
from tests.store.crash_worker import HEAVY_OPS, LIGHT_OPS, kill_and_check, removed_since, snapshot

FULL = {"writer_kills": 35, "daemon_kills": 6, "streams": 32, "cli": None, "throttle": 64_000}
# about how long each operation takes on the tiny pool (a kill lands within it; later is fine too)
OP_SECONDS = {"import": 0.05, "rm": 0.01, "budget": 0.03, "gc": 0.01, "pull": 2.0, "maintain": 0.03, "merge": 1.5,
              "compress": 1.0}
QUICK = {"writer_kills": 2, "daemon_kills": 1, "streams": 4, "cli": 4, "throttle": None}  # no pull is killed


@dataclass
class Tally:
    tried: int = 0
    ok: int = 0
    lost: int = 0
    detail: dict = field(default_factory=dict)  # e.g. kills per interrupted operation
    failures: list = field(default_factory=list)

    def add(self, ok: bool, what: str, lost: int = 0) -> None:
        self.tried += 1
        self.ok += ok
        self.lost += lost
        if not ok:
            self.failures.append(what)


# -- setup -------------------------------------------------------------------------------------

@dataclass
class Bench:
    root: Path
    home: Path
    config_path: Path
    registry_url: str
    variants: list[str]
    tiny_base: Path

    def env(self) -> dict[str, str]:
        return {"ZENEDGE_HOME": str(self.home), "ZENEDGE_CONFIG": str(self.config_path), "XDG_RUNTIME_DIR": ""}

    def budget(self) -> int:
        from zenedge import config

        return config.load(self.config_path).budget

    def reset(self) -> None:
        """A roomy budget and the daemon's profiles p0..p3 back (writer kills may have evicted them)."""
        from zenedge import config, pool
        from zenedge.store import Store

        write_config(self.config_path, {**DEFAULT_CONFIG, "registry": {"urls": [self.registry_url]}})
        store = Store(self.home)
        shapes = tiny_module_shapes(self.tiny_base)
        for seed, name in enumerate(PROFILES):
            if store.name(name) is None:
                lora = write_lora_dir(self.root / f"lora-{name}", shapes, seed=seed + 1, scale=0.3)
                pool.import_lora(store, config.load(self.config_path), lora, name, base="tiny")
        store.close()


# -- writer kills ------------------------------------------------------------------------------

def writer_kills(bench: Bench, rounds: int, ops: list[str], rng: random.Random, log) -> Tally:
    """Each round's worker imports and does one other operation in a loop (round robin over `ops`);
    the kill lands at a random instant within that operation's usual duration after it starts, so
    the kills spread over every operation rather than piling up in the slowest."""
    tally = Tally()
    env = {k: v for k, v in bench.env().items() if k != "XDG_RUNTIME_DIR"}
    for round_ in range(rounds):
        focus = ops[round_ % len(ops)]
        kill = kill_and_check(bench.home, bench.variants, 1000 + round_, rng.uniform(0, OP_SECONDS[focus]),
                              sorted({"import", focus}), bench.budget, env=env, target=focus)
        ok = kill.killed and not kill.problems and not kill.lost
        tally.add(ok, f"writer kill {round_} during {kill.op}: {kill.problems} lost {kill.lost}", len(kill.lost))
        tally.detail[kill.op] = tally.detail.get(kill.op, 0) + 1
        log(f"writer kill {round_ + 1}/{rounds} (aimed at {focus}) during {kill.op}: {'ok' if ok else 'FAILED'}")
    return tally


# -- the daemon --------------------------------------------------------------------------------

def _check_after(bench: Bench, before: set[str], since: float) -> tuple[list[str], list[str]]:
    from tests.store.crash_worker import ALLOWED_BEFORE_RECONCILE
    from zenedge.bases import check_bases
    from zenedge.store import Store

    raw = Store(bench.home, reconcile=False)
    problems = [p for p in raw.check(budget=bench.budget()) if not p.startswith(ALLOWED_BEFORE_RECONCILE)]
    raw.close()
    store = Store(bench.home)
    problems += [f"after reconcile: {p}" for p in store.check(budget=bench.budget()) + check_bases(store)]
    lost = sorted(before - {r["name"] for r in store.names()} - removed_since(store, since))
    store.close()
    return problems, lost


def _kill_mid_stream(daemon: ProcessDaemon) -> str:
    with daemon.uds() as http:
        with http.stream("POST", "/v1/chat/completions",
                         json={**chat_body("forever", "a long answer", max_tokens=4000), "stream": True}) as response:
            lines = (line for line in response.iter_lines() if line)
            for _ in range(3):
                next(lines)
            daemon.signal(signal.SIGKILL)
    return "stream"


def _kill_mid_pull(daemon: ProcessDaemon, name: str) -> str:
    with daemon.uds() as http:
        http.post("/api/rm", json={"name": name})  # so that the pull downloads (404 when absent: fine)
        with http.stream("POST", "/api/pull", json={"name": name}) as response:
            for line in response.iter_lines():
                event = json.loads(line) if line else {}
                if event.get("status") == "downloading" and event.get("total", 0) > 50_000:  # the weights
                    daemon.signal(signal.SIGKILL)
                    break
    return "pull"


def daemon_kills(bench: Bench, rounds: int, log) -> Tally:
    tally = Tally()
    for round_ in range(rounds):
        before, since = snapshot(bench.home)
        daemon = ProcessDaemon.start(bench.home, bench.config_path)
        try:
            what = _kill_mid_stream(daemon) if round_ % 2 == 0 else _kill_mid_pull(daemon, "coder")
            daemon.wait(60)
        finally:
            daemon.kill()
        problems, lost = _check_after(bench, before, since)
        ok = daemon.process.returncode == -signal.SIGKILL and not problems and not lost
        tally.add(ok, f"daemon kill {round_} mid-{what}: {problems} lost {lost}", len(lost))
        tally.detail[what] = tally.detail.get(what, 0) + 1
        log(f"daemon kill {round_ + 1}/{rounds} mid-{what}: {'ok' if ok else 'FAILED'}")
    return tally


def streams_held(daemon: ProcessDaemon, count: int) -> Tally:
    """`count` streams at once over the profiles; each must end properly with exactly the text it
    gets alone (temperature 0)."""
    import httpx

    bodies = [chat_body(PROFILES[i % len(PROFILES)], f"request {i}: " + "abc"[i % 3] * (i % 7), max_tokens=16)
              for i in range(count)]
    with daemon.uds() as http:
        alone = [http.post("/v1/chat/completions", json=b).json()["choices"][0] for b in bodies]

    async def all_at_once():
        transport = httpx.AsyncHTTPTransport(uds=str(daemon.socket))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=600,
                                     limits=httpx.Limits(max_connections=count)) as client:
            return await asyncio.gather(*(stream_text(client, b) for b in bodies), return_exceptions=True)

    tally = Tally()
    for i, (result, reference) in enumerate(zip(asyncio.run(all_at_once()), alone)):
        ok = (not isinstance(result, BaseException) and result[2] and result[1] == reference["finish_reason"]
              and result[0] == reference["message"]["content"])
        tally.add(ok, f"stream {i}: {result!r:.200}")
    return tally


# -- the disk and the environment --------------------------------------------------------------

def one_error_line(result, code: int) -> bool:
    """A refused command as the README promises: exit `code`, one `error:` line, no traceback."""
    lines = result.stderr.splitlines()
    return (result.returncode == code and len(lines) == 1 and lines[0].startswith("error: ")
            and "Traceback" not in result.stderr and "internal error" not in result.stderr)


def _copy_home(bench: Bench, copy: Path) -> Path:
    """The bench's pool copied to `copy` (without its daemon's socket and locks)."""
    import shutil

    shutil.copytree(bench.home, copy, ignore=shutil.ignore_patterns("run", "lock", "daemon.lock"))
    return copy


def _blobs(home: Path) -> set[str]:
    return {p.name for p in (home / "blobs").iterdir()} | {p.name for p in (home / "bases").iterdir()}


@contextlib.contextmanager
def mounted(args: list[str], target: Path):
    """A mount for the block (root only); None where this machine does not allow one."""
    target.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", *args, str(target)], capture_output=True).returncode != 0:
        yield None
        return
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def fill_disk(folder: Path) -> Path:
    """Fill the file system holding `folder` to the last byte; returns the filler file."""
    import shutil

    filler = folder / "filler"
    with open(filler, "ab", buffering=0) as handle:
        with contextlib.suppress(OSError):   # ENOSPC: full
            handle.write(bytes(shutil.disk_usage(folder).free))
            while handle.write(bytes(4096)):
                pass
    return filler


def disk_faults(bench: Bench, log, quick: bool = False) -> Tally:
    """What the disk and the environment do to a pool: damaged or emptied indexes, damaged blobs, a
    read-only home, a full disk, FIFOs and huge files where files are expected. Each is one error
    line with its documented exit code (no traceback, no "internal error"), nothing is served from
    damaged data, and nothing is deleted; `pool recover` then brings every profile back."""
    import random as random_module

    tally = Tally()

    def case(label: str, ok: bool, lost: int = 0) -> None:
        tally.add(ok, label, lost)
        tally.detail[label.split(":")[0]] = tally.detail.get(label.split(":")[0], 0) + 1
        log(f"disk fault: {label}: {'ok' if ok else 'FAILED'}")

    names = sorted(row["name"] for row in json.loads(run_cli("list", "--json", env=bench.env(), check=True).stdout))
    damages = {
        "empty": lambda data: b"",
        "garbage header": lambda data: b"not an sqlite db" + data[16:],
        "truncated": lambda data: data[: len(data) // 3],
        "random pages": lambda data: data[:4096] + random_module.Random(3).randbytes(len(data) - 4096),
    }
    for how, damage in list(damages.items())[:1 if quick else None]:
        home = _copy_home(bench, bench.root / "disk" / f"index-{how.replace(' ', '-')}")
        index = home / "index.db"
        sqlite3.connect(index).execute("PRAGMA wal_checkpoint(TRUNCATE)").connection.close()
        index.write_bytes(damage(index.read_bytes()))
        for suffix in ("-wal", "-shm"):
            index.with_name(index.name + suffix).unlink(missing_ok=True)
        env = {**bench.env(), "ZENEDGE_HOME": str(home), "ZENEDGE_KEEP_ALIVE": "0"}
        before = _blobs(home)
        refused = all(one_error_line(run_cli(*args, env=env), 65) for args in
                      (["list"], ["budget", "show"], ["rm", "p0"], ["run", "p0", "hi"], ["pool", "check"]))
        kept = _blobs(home) == before
        recovered = run_cli("pool", "recover", "--json", env=env)
        back = recovered.returncode == 0 and sorted(json.loads(recovered.stdout)["profiles"]) == names
        case(f"index {how}: refused in one line by every command, nothing deleted, recovered", refused and kept and back,
             lost=0 if kept else len(before - _blobs(home)))

    home = _copy_home(bench, bench.root / "disk" / "blob-flipped")
    env = {**bench.env(), "ZENEDGE_HOME": str(home), "ZENEDGE_KEEP_ALIVE": "0"}
    from zenedge.store import Store

    store = Store(home)
    blob = store.blob_path(store.resolve("p1")["sha256"])
    store.close()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    served = run_cli("run", "p1", "hi", "--max-tokens", "2", env=env)
    checked = run_cli("pool", "check", env=env)
    case("damaged blob: refused by run, reported by pool check (exit 65)",
         one_error_line(served, 65) and "'p1'" in served.stderr and one_error_line(checked, 65)
         and "'p1' is damaged" in checked.stdout)
    exported = run_cli("export", str(bench.root / "disk" / "export" / "out"), "p0", "p1", env=env)
    case("damaged blob: export refused in one line, nothing left where it wrote",
         one_error_line(exported, 65) and not (bench.root / "disk" / "export").exists())
    daemon = ProcessDaemon.start(home, bench.config_path)
    try:
        with daemon.uds() as http:
            answer = http.post("/v1/chat/completions", json=chat_body("p1", "hi", max_tokens=2))
            healthy = http.post("/v1/chat/completions", json=chat_body("p0", "hi", max_tokens=2)).status_code == 200
        case("damaged blob through the daemon: an error naming it, others still served",
             answer.status_code == 500 and answer.json()["error"]["code"] == "blob_damaged" and healthy)
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait(60)

    fifo = bench.root / "disk" / "fifo"
    os.mkfifo(fifo)
    huge = bench.root / "disk" / "huge.jsonl"
    with open(huge, "wb") as handle:
        handle.truncate(2 << 30)
    env = {**bench.env(), "ZENEDGE_KEEP_ALIVE": "0"}
    started = time.monotonic()
    refused = [one_error_line(run_cli("import", str(fifo), "--name", "x", "--base", "tiny", env=env), 2),
               one_error_line(run_cli("import", bench.variants[0], "--name", "x", "--base", "tiny", "--eval", str(fifo),
                                 env=env), 2),
               one_error_line(run_cli("import", bench.variants[0], "--name", "x", "--base", "tiny", "--eval", str(huge),
                                 env=env), 2)]
    case("FIFO and 2 GB eval set: refused from a stat", all(refused) and time.monotonic() - started < 60)
    daemon = ProcessDaemon.start(bench.home, bench.config_path)
    try:
        with daemon.uds(timeout=30) as http:
            answer = http.post("/api/import", json={"path": str(fifo), "name": "x", "stream": False})
            health = http.get("/health", timeout=1.0)
        case("FIFO through the daemon: 400, /health answers within 1 s",
             answer.status_code == 400 and health.status_code == 200)
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait(60)

    with mounted(["--bind", str(bench.home)], bench.root / "disk" / "read-only") as view:
        if view is not None and subprocess.run(["mount", "-o", "remount,ro,bind", str(view)]).returncode == 0:
            env = {**bench.env(), "ZENEDGE_HOME": str(view), "ZENEDGE_KEEP_ALIVE": "0"}
            reads = all(run_cli(*args, env=env).returncode == 0 for args in
                        (["list"], ["budget", "show"], ["pool", "status"], ["pool", "check"],
                         ["run", "p0", "hi", "--max-tokens", "2"]))
            writes = all(one_error_line(run_cli(*args, env=env), 77) for args in
                         (["rm", "p0"], ["pin", "p0"], ["budget", "set", "1GB"], ["serve"],
                          ["import", bench.variants[0], "--name", "x", "--base", "tiny"]))
            case("read-only home: reads work, writes refused in one line", reads and writes)

    with mounted(["-t", "tmpfs", "-o", "size=8m", "tmpfs"], bench.root / "disk" / "small") as small:
        if small is not None:
            import shutil

            env = {**bench.env(), "ZENEDGE_HOME": str(_copy_home(bench, small / "home")), "ZENEDGE_KEEP_ALIVE": "0"}
            with open(small / "filler", "wb") as handle:
                handle.write(bytes(shutil.disk_usage(small).free - (1 << 20)))
            margin = one_error_line(run_cli("import", bench.variants[1], "--name", "x", "--base", "tiny", env=env), 74)
            with open(small / "filler", "ab") as handle:
                handle.write(bytes(max(0, shutil.disk_usage(small).free - 20_000)))
            full = all(one_error_line(run_cli(*args, env=env), 74) for args in
                       (["base", "add", str(bench.tiny_base), "--name", "copy"], ["rm", "p0"]))
            fill_disk(small)   # not a byte left: reads need none (SQLite's WAL index then lives in memory)
            reads = all(run_cli(*args, env=env).returncode == 0 for args in
                        (["list"], ["pool", "check"], ["run", "p0", "hi", "--max-tokens", "2"]))
            write = one_error_line(run_cli("rm", "p0", env=env), 74)
            (small / "filler").unlink()
            consistent = run_cli("pool", "check", env=env).returncode == 0
            case("full disk: the margin check and a write that meets it, one line each; pool consistent",
                 margin and full and consistent)
            case("disk full to the last byte: reads work in-process, a write is one line", reads and write and consistent)
    if not quick:   # converting the default base takes ~30 s a time
        with mounted(["-t", "tmpfs", "-o", "size=40m", "tmpfs"], bench.root / "disk" / "no-room-for-the-base") as small:
            if small is not None:
                config_path = bench.root / "disk" / "default-registry.toml"   # `writer` is on the default base
                write_config(config_path, DEFAULT_CONFIG)
                home = small / "home"
                env = {**bench.env(), "ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path),
                       "ZENEDGE_KEEP_ALIVE": "0"}
                local = one_error_line(run_cli("pull", "writer", env=env), 74)
                daemon = ProcessDaemon.start(home, config_path)
                try:
                    through = one_error_line(run_cli("pull", "writer", env=env), 74)
                finally:
                    daemon.signal(signal.SIGTERM)
                    daemon.wait(60)
                left = [p for p in (home / "tmp").rglob("*") if not p.is_dir()] + list((home / "bases").iterdir())
                consistent = run_cli("pool", "check", env=env).returncode == 0 and not left
                case("full disk while the default base is converted: one line in-process and through the daemon, "
                     "no base left", local and through and consistent)
    return tally


def daemon_life(bench: Bench, log) -> Tally:
    """The daemon as the README's flows meet it: `serve` takes over from a daemon a command started,
    eight concurrent pulls queue instead of timing out, `stop` returns once the process is gone."""
    import threading

    tally = Tally()
    env = {**bench.env(), "ZENEDGE_KEEP_ALIVE": "120"}
    run_cli("run", "p0", "hi", "--max-tokens", "2", env=env, check=True)
    from zenedge.api import discovery

    on_demand = discovery.read_info(bench.home)["pid"]
    served = ProcessDaemon.start(bench.home, bench.config_path)
    try:
        deadline = time.monotonic() + 60
        while _alive(on_demand) and time.monotonic() < deadline:
            time.sleep(0.1)
        tally.add(not _alive(on_demand) and served.process.poll() is None, "serve took over from the on-demand daemon")
        log(f"daemon: serve took over from the on-demand one: {'ok' if tally.ok == tally.tried else 'FAILED'}")
        outcomes = []

        def pull(name: str) -> None:
            with served.uds(timeout=600) as http:
                answer = http.post("/api/pull", json={"name": name, "stream": False})
            outcomes.append(answer.json().get("status") if answer.status_code == 200
                            else answer.json().get("error", {}).get("code"))

        with served.uds() as http:
            for name in ("writer", "coder"):
                http.post("/api/rm", json={"name": name})
        threads = [threading.Thread(target=pull, args=(name,)) for name in ["writer", "coder", "writer-copy"] * 3][:8]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        ok = len(outcomes) == 8 and set(outcomes) <= {"success", "budget_exceeded"}
        tally.add(ok, f"8 concurrent pulls through one daemon: {outcomes}")
        log(f"daemon: 8 concurrent pulls: {outcomes}")
    finally:
        stopped = run_cli("stop", env=bench.env())
        gone = not _alive(served.process.pid)
        tally.add(stopped.returncode == 0 and gone, f"stop returned once the daemon exited: {stopped.stderr[-200:]}")
        log(f"daemon: stop waited for the exit: {'ok' if gone else 'FAILED'}")
        served.kill()
    return tally


def _alive(pid: int) -> bool:
    from zenedge.cli.daemon import exited

    return not exited(pid)


# -- bad input ---------------------------------------------------------------------------------

def fingerprint(bench: Bench) -> tuple:
    """What a refused input must not change: names → adapters, stored blobs, bases, the config file."""
    from zenedge.store import Store

    store = Store(bench.home, reconcile=False)
    state = (tuple(sorted((r["name"], r["adapter_id"]) for r in store.names())),
             tuple(sorted(store.blobs.digests())), tuple(sorted(b["name"] for b in store.bases())),
             bench.config_path.read_bytes())
    store.close()
    return state


def _deep(depth: int) -> bytes:
    return b'{"model": "p0", "messages": [' + b'{"a": [' * depth + b"]}" * depth + b"]}"


def _chunks():  # no Content-Length: the limit must hold on the bytes actually sent
    for _ in range(48):
        yield b"x" * 65536


CHAT = "/v1/chat/completions"
# (label, method, path, body: dict → JSON | bytes | callable → content, expected status, expected code,
#  client: "uds" | "tcp" | "anonymous" | "wrong-token", extra headers)
HTTP_CASES = [
    ("truncated JSON", "POST", CHAT, b'{"model": "p0", ', 400, "invalid_json", "uds", {}),
    ("trailing comma", "POST", CHAT, b'{"model": "p0", "messages": [],}', 400, "invalid_json", "uds", {}),
    ("not JSON", "POST", CHAT, b"hello", 400, "invalid_json", "uds", {}),
    ("form body", "POST", "/api/rm", b"name=p0", 400, "invalid_json", "uds",
     {"Content-Type": "application/x-www-form-urlencoded"}),
    ("JSON nested 100k deep", "POST", CHAT, b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json", "uds", {}),
    ("messages nested 3000 deep", "POST", CHAT, _deep(3000), 400, "invalid_json", "uds", {}),
    ("not UTF-8", "POST", CHAT, b'{"model": "p0", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
     400, "invalid_json", "uds", {}),
    ("no messages", "POST", CHAT, {"model": "p0"}, 422, "invalid_request", "uds", {}),
    ("messages not a list", "POST", CHAT, {"model": "p0", "messages": "hi"}, 422, "invalid_request", "uds", {}),
    ("unknown role", "POST", CHAT, {"model": "p0", "messages": [{"role": "wizard", "content": "hi"}]},
     422, "invalid_request", "uds", {}),
    ("content a number", "POST", CHAT, {"model": "p0", "messages": [{"role": "user", "content": 5}]},
     422, "invalid_request", "uds", {}),
    ("temperature 500", "POST", CHAT, {**chat_body("p0", "hi"), "temperature": 500}, 422, "invalid_request", "uds", {}),
    ("temperature NaN", "POST", CHAT,
     b'{"model": "p0", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
     422, "invalid_request", "uds", {}),
    ("top_p 2", "POST", CHAT, {**chat_body("p0", "hi"), "top_p": 2}, 422, "invalid_request", "uds", {}),
    ("n 9", "POST", CHAT, {**chat_body("p0", "hi"), "n": 9}, 422, "invalid_request", "uds", {}),
    ("max_tokens 0", "POST", CHAT, {**chat_body("p0", "hi"), "max_tokens": 0}, 422, "invalid_request", "uds", {}),
    ("max_tokens -1", "POST", CHAT, {**chat_body("p0", "hi"), "max_tokens": -1}, 422, "invalid_request", "uds", {}),
    ("max_tokens text", "POST", CHAT, {**chat_body("p0", "hi"), "max_tokens": "lots"}, 422, "invalid_request",
     "uds", {}),
    ("max_tokens 1e999", "POST", CHAT,
     b'{"model": "p0", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e999}',
     422, "invalid_request", "uds", {}),
    ("17 stop strings", "POST", CHAT, {**chat_body("p0", "hi"), "stop": ["a"] * 17}, 422, "invalid_request", "uds", {}),
    ("lone surrogate in content", "POST", CHAT,
     b'{"model": "p0", "messages": [{"role": "user", "content": "\\ud800"}]}', 422, "invalid_request", "uds", {}),
    ("lone surrogate in prompt", "POST", "/v1/completions", b'{"model": "p0", "prompt": "\\udfff"}',
     422, "invalid_request", "uds", {}),
    ("unknown model", "POST", CHAT, chat_body("ghost", "hi"), 404, "adapter_not_found", "uds", {}),
    ("model ../etc", "POST", CHAT, chat_body("../etc/passwd", "hi"), 404, "adapter_not_found", "uds", {}),
    ("model with spaces", "POST", CHAT, chat_body("GPT-4 (turbo)", "hi"), 404, "adapter_not_found", "uds", {}),
    ("completion, unknown model", "POST", "/v1/completions", {"model": "ghost", "prompt": "x"}, 404,
     "adapter_not_found", "uds", {}),
    ("completion, no prompt", "POST", "/v1/completions", {"model": "p0"}, 422, "invalid_request", "uds", {}),
    ("unknown endpoint", "GET", "/v2/nothing", None, 404, "not_found", "uds", {}),
    ("wrong method", "GET", CHAT, None, 405, "method_not_allowed", "uds", {}),
    ("3 MB body", "POST", CHAT, chat_body("p0", "x" * (3 << 20)), 413, "payload_too_large", "uds", {}),
    ("3 MB chunked body", "POST", "/api/rm", _chunks, 413, "payload_too_large", "uds", {}),
    ("no token on TCP", "POST", CHAT, chat_body("p0", "hi"), 401, "unauthorized", "anonymous", {}),
    ("wrong token on TCP", "GET", "/api/ps", None, 401, "unauthorized", "wrong-token", {}),
    ("foreign Host", "GET", "/v1/models", None, 403, "forbidden", "tcp", {"Host": "evil.example"}),
    ("rebinding Host", "GET", "/health", None, 403, "forbidden", "uds", {"Host": "127.0.0.1.evil.example"}),
    ("foreign Origin", "GET", "/v1/models", None, 403, "forbidden", "tcp", {"Origin": "https://evil.example"}),
    ("rm unknown", "POST", "/api/rm", {"name": "ghost"}, 404, "adapter_not_found", "uds", {}),
    ("rm ../x", "POST", "/api/rm", {"name": "../x"}, 400, "invalid_name", "uds", {}),
    ("rm, extra field", "POST", "/api/rm", {"name": "p0", "force": True}, 422, "invalid_request", "uds", {}),
    ("budget lots", "PUT", "/api/budget", {"size": "lots"}, 400, "invalid_input", "uds", {}),
    ("budget 0.5B", "PUT", "/api/budget", {"size": "0.5B"}, 400, "invalid_input", "uds", {}),
    ("budget 1.5", "PUT", "/api/budget", {"size": "1.5"}, 400, "invalid_input", "uds", {}),
    ("budget 0", "PUT", "/api/budget", {"size": "0"}, 400, "invalid_input", "uds", {}),
    ("budget -1GB", "PUT", "/api/budget", {"size": "-1GB"}, 400, "invalid_input", "uds", {}),
    ("budget, a number", "PUT", "/api/budget", {"size": 5}, 422, "invalid_request", "uds", {}),
    ("budget, typo", "PUT", "/api/budget", {"size": "1GiB", "dry_run": True, "typo": 1}, 422, "invalid_request",
     "uds", {}),
    ("pull unknown", "POST", "/api/pull", {"name": "ghost"}, 404, "profile_not_found", "uds", {}),
    ("pull ../x", "POST", "/api/pull", {"name": "../x"}, 400, "invalid_name", "uds", {}),
    ("pull empty name", "POST", "/api/pull", {"name": ""}, 422, "invalid_request", "uds", {}),
    ("pull bad version", "POST", "/api/pull", {"name": "writer:9.9.9"}, 404, "profile_not_found", "uds", {}),
    ("maintain with an action", "POST", "/api/pool", {"action": "nuke"}, 422, "invalid_request", "uds", {}),
    ("stop with a malformed body", "POST", "/api/stop", b"{{", 400, "invalid_json", "uds", {}),
    ("stop with a field", "POST", "/api/stop", {"now": True}, 422, "invalid_request", "uds", {}),
    ("budget 1e23 TB", "PUT", "/api/budget", {"size": "99999999999999999999999TB"}, 400, "invalid_input", "uds", {}),
    ("pin, extra field", "POST", "/api/pin", {"name": "p0", "forever": True}, 422, "invalid_request", "uds", {}),
    ("import over TCP", "POST", "/api/import", {"path": "/tmp/x", "name": "x"}, 403, "forbidden", "tcp", {}),
    ("compress over TCP", "POST", "/api/compress", {"finetuned": "/tmp/x", "name": "x"}, 403, "forbidden", "tcp", {}),
    ("merge unknown", "POST", "/api/merge", {"names": ["ghost", "p0"]}, 404, "adapter_not_found", "uds", {}),
]


def bad_http(daemon: ProcessDaemon, bench: Bench, cases=HTTP_CASES) -> Tally:
    tally = Tally()
    before = fingerprint(bench)
    clients = {"uds": daemon.uds(), "tcp": daemon.tcp(), "anonymous": daemon.tcp(token=None),
               "wrong-token": daemon.tcp(token="wrong")}
    try:
        for label, method, path, body, status, code, via, headers in cases:
            kwargs = {"json": body} if isinstance(body, dict) else {"content": body() if callable(body) else body}
            try:
                response = clients[via].request(method, path, headers=headers, **kwargs)
                error = response.json().get("error", {}) if response.headers.get("content-type", "").startswith(
                    "application/json") else {}
                ok = (response.status_code == status and error.get("code") == code and bool(error.get("message"))
                      and "Traceback" not in response.text)
                got = f"{response.status_code} {response.text[:160]}"
            except Exception as exc:  # a dropped connection is a failure to refuse properly
                ok, got = False, f"{type(exc).__name__}: {exc}"
            tally.add(ok, f"{label}: expected {status} {code}, got {got}")
        healthy = clients["uds"].get("/health").status_code == 200
        tally.add(healthy and fingerprint(bench) == before, "daemon healthy and pool unchanged after bad requests")
    finally:
        for client in clients.values():
            client.close()
    return tally


def cli_cases(bench: Bench) -> list[tuple[str, list[str], int, dict]]:
    """(label, argv, expected exit code, extra environment)."""
    root = bench.root / "bad-cli"
    root.mkdir(exist_ok=True)
    variant = bench.variants[0]
    text_file = root / "notes.txt"
    text_file.write_text("not an adapter")
    empty = root / "empty"
    empty.mkdir(exist_ok=True)
    truncated = Path(write_lora_dir(root / "truncated", tiny_module_shapes(bench.tiny_base)))
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    fifo_weights = root / "fifo-weights"
    if not fifo_weights.exists():   # (writing the weights again would open the FIFO and block)
        write_lora_dir(fifo_weights, tiny_module_shapes(bench.tiny_base))
        (fifo_weights / "adapter_model.safetensors").unlink()
        os.mkfifo(fifo_weights / "adapter_model.safetensors")
    pickled = Path(write_lora_dir(root / "pickled", tiny_module_shapes(bench.tiny_base)))
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04pickle")
    odd_targets = Path(write_lora_dir(root / "odd-targets", tiny_module_shapes(bench.tiny_base)))
    config = json.loads((odd_targets / "adapter_config.json").read_text())
    (odd_targets / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["q_proj", "nope"]}))
    broken_toml = root / "broken.toml"
    broken_toml.write_text("[pool\nbudget = 4GiB\n")
    float_budget = root / "float.toml"
    float_budget.write_text("[pool]\nbudget = 1.5\n")
    bad_registry = root / "registry"
    bad_registry.mkdir(exist_ok=True)
    (bad_registry / "index.json").write_text(json.dumps(
        {"format": "zenedge-registry/1", "profiles": [{"name": "x", "size": "abc", "manifest": "x/manifest.json"}]}))
    nan_keep_alive = root / "nan.toml"
    nan_keep_alive.write_text("[server]\nkeep_alive = nan\n")
    bad_registry_cfg = root / "bad-registry.toml"
    bad_registry_cfg.write_text(f'[registry]\nurls = ["file://{bad_registry}"]\n')
    tiny = ["--base", "tiny"]  # the test pool's base (without it, import sets up the default real base first)
    return [
        ("import: no such path", ["import", "/nonexistent", "--name", "x", *tiny], 2, {}),
        ("import: a text file", ["import", str(text_file), "--name", "x", *tiny], 2, {}),
        ("import: name ../evil", ["import", variant, "--name", "../evil", *tiny], 2, {}),
        ("import: unknown base", ["import", variant, "--name", "x", "--base", "ghost"], 1, {}),
        ("import: --eval missing", ["import", variant, "--name", "x", *tiny, "--eval", "/nonexistent.jsonl"], 2, {}),
        ("import: --eval a directory", ["import", variant, "--name", "x", *tiny, "--eval", "/tmp"], 2, {}),
        ("import: --eval /etc/passwd", ["import", variant, "--name", "x", *tiny, "--eval", "/etc/passwd"], 2, {}),
        ("import: truncated weights", ["import", str(truncated), "--name", "x", *tiny], 2, {}),
        ("import: pickle", ["import", str(pickled), "--name", "x", *tiny], 2, {}),
        ("import: weights a FIFO", ["import", str(fifo_weights), "--name", "x", *tiny], 2, {}),
        ("import: targets the base lacks", ["import", str(odd_targets), "--name", "x", *tiny], 2, {}),
        ("rm: unknown", ["rm", "ghost"], 1, {}),
        ("rm: ../x", ["rm", "../x"], 2, {}),
        ("budget set lots", ["budget", "set", "lots"], 2, {}),
        ("budget set 1.5", ["budget", "set", "1.5"], 2, {}),
        ("budget set 0.5B", ["budget", "set", "0.5B"], 2, {}),
        ("budget set 0", ["budget", "set", "0"], 2, {}),
        ("budget set -1GB", ["budget", "set", "-1GB"], 2, {}),
        ("pull: unknown", ["pull", "ghost"], 1, {}),
        ("pull: ../x", ["pull", "../x"], 2, {}),
        ("export to /proc", ["export", "/proc/zz", "p0"], 1, {}),
        ("export: unknown name", ["export", str(root / "out"), "ghost"], 1, {}),
        ("compress: not a checkpoint", ["compress", "--base", "tiny", "--finetuned", str(empty), "--name", "x"], 2, {}),
        ("compress: no such directory", ["compress", "--finetuned", "/nonexistent", "--name", "x"], 2, {}),
        ("merge: unknown", ["merge", "ghost", "p0"], 1, {}),
        ("pin: unknown", ["pin", "ghost"], 1, {}),
        ("base add: no such path", ["base", "add", "/nonexistent", "--name", "x"], 2, {}),
        ("unknown option", ["list", "--bogus"], 2, {}),
        ("unknown command", ["pool", "nope"], 2, {}),
        ("missing argument", ["rm"], 2, {}),
        ("registry build: no such path", ["registry", "build", "/nonexistent"], 2, {}),
        ("broken config", ["list"], 2, {"ZENEDGE_CONFIG": str(broken_toml)}),
        ("budget = 1.5 in the config", ["list"], 2, {"ZENEDGE_CONFIG": str(float_budget)}),
        ("index size 'abc'", ["search"], 1, {"ZENEDGE_CONFIG": str(bad_registry_cfg)}),
        ("budget set 99999999999999999999999TB", ["budget", "set", "99999999999999999999999TB"], 2, {}),
        ("ZENEDGE_KEEP_ALIVE=inf", ["run", "p0", "hi"], 2, {"ZENEDGE_KEEP_ALIVE": "inf"}),
        ("ZENEDGE_KEEP_ALIVE=1e400", ["pull", "writer"], 2, {"ZENEDGE_KEEP_ALIVE": "1e400"}),
        ("ZENEDGE_KEEP_ALIVE=1e-9", ["run", "p0", "hi"], 2, {"ZENEDGE_KEEP_ALIVE": "1e-9"}),
        ("keep_alive = nan in the config", ["list"], 2, {"ZENEDGE_CONFIG": str(nan_keep_alive)}),
        ("ZENEDGE_THREADS=lots", ["run", "p0", "hi"], 2, {"ZENEDGE_THREADS": "lots"}),
    ]


def bad_cli(bench: Bench, limit: int | None, log) -> Tally:
    tally = Tally()
    before = fingerprint(bench)
    cases = cli_cases(bench)
    for label, argv, code, env in cases[:limit] if limit else cases:
        result = run_cli(*argv, env={**bench.env(), **env})
        ok = one_error_line(result, code)
        tally.add(ok, f"{label}: expected exit {code}, got {result.returncode}: {result.stderr[-300:]!r}")
        log(f"bad CLI input {tally.tried}: {label}: {'ok' if ok else 'FAILED'}")
    tally.add(fingerprint(bench) == before, "pool unchanged after the bad CLI inputs")
    return tally


# -- the run -----------------------------------------------------------------------------------

def run(root: Path, *, writer_kills_n: int, daemon_kills_n: int, streams: int, cli: int | None,
        throttle: float | None, heavy: bool, seed: int = 7, log=print) -> dict:
    rng = random.Random(seed)
    started = time.monotonic()
    tiny = make_tiny_base(root / "tiny-base")
    home, config_path = make_home(root / "pool", tiny)
    from zenedge.store import Store

    store = Store(home)
    registry = build_tiny_registry(root / "registry", tiny_module_shapes(tiny), store.base("tiny")["sha256"])
    store.close()
    results: dict[str, Tally] = {}
    with serve_registry(registry, throttle=throttle) as (url, registry_log):
        shapes = tiny_module_shapes(tiny)
        variants = [str(write_lora_dir(root / f"v{i}", shapes, rank=2 + i, seed=i)) for i in range(4)]
        bench = Bench(root, home, config_path, url, variants, tiny)
        bench.reset()
        ops = list(LIGHT_OPS) + (list(HEAVY_OPS) if heavy else [])
        results["writer_kills"] = writer_kills(bench, writer_kills_n, ops, rng, log)
        bench.reset()
        results["daemon_kills"] = daemon_kills(bench, daemon_kills_n, log)
        bench.reset()
        daemon = ProcessDaemon.start(home, config_path)
        try:
            results["streams"] = streams_held(daemon, streams)
            log(f"concurrent streams: {results['streams'].ok}/{results['streams'].tried} held")
            results["bad_http"] = bad_http(daemon, bench)
            log(f"bad HTTP requests: {results['bad_http'].ok}/{results['bad_http'].tried} refused correctly")
            with daemon.uds() as http:  # a download a kill interrupted resumes and completes
                resumed = http.post("/api/pull", json={"name": "coder", "stream": False})
            resumed_from_partial = any(r for p, r in registry_log.log if p.startswith("/coder/") and r)
            log(f"pull after the kills: {resumed.status_code}, resumed a partial file: {resumed_from_partial}")
            daemon.signal(signal.SIGTERM)
            clean_exit = daemon.wait(60) == 0
            log(f"daemon stopped with SIGTERM: exit {daemon.process.returncode}")
        finally:
            daemon.kill()
        daemon_log = daemon.process.stderr.read()[-4000:]
        results["bad_cli"] = bad_cli(bench, cli, log)
        results["disk"] = disk_faults(bench, log, quick=not heavy)
        if heavy:
            results["daemon_life"] = daemon_life(bench, log)
        final = run_cli("pool", "check", "--deep", "--json", env=bench.env())
    check = json.loads(final.stdout) if final.stdout.strip() else {"ok": False, "problems": [final.stderr]}
    lost = sum(t.lost for t in results.values())
    return {
        "date": datetime.date.today().isoformat(), "seconds": round(time.monotonic() - started, 1),
        "host": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "settings": {"writer_kills": writer_kills_n, "writer_ops": ops, "daemon_kills": daemon_kills_n,
                     "streams": streams, "registry_throttle_bytes_per_s": throttle, "seed": seed},
        "results": {name: asdict(t) for name, t in results.items()},
        "resumed_pull_ok": resumed.status_code == 200, "resumed_from_partial": resumed_from_partial,
        **({} if resumed.status_code == 200 and clean_exit else {"resumed_pull": resumed.text[:2000],
                                                                  "daemon_log": daemon_log}),
        "daemon_clean_exit": clean_exit,
        "final_check": check, "lost": lost,
        "ok": (all(t.ok == t.tried for t in results.values()) and check.get("ok") and lost == 0
               and resumed.status_code == 200 and clean_exit),
    }


def table(report: dict) -> str:
    r = report["results"]
    by_op = ", ".join(f"{op} {n}" for op, n in sorted(r["writer_kills"]["detail"].items()))
    by_kind = ", ".join(f"mid-{k} {n}" for k, n in sorted(r["daemon_kills"]["detail"].items()))
    rows = [
        ("SIGKILLed pool writers", r["writer_kills"], f"during: {by_op}"),
        ("SIGKILLed daemons", r["daemon_kills"], by_kind),
        ("bad CLI inputs", r["bad_cli"], "one error: line, documented exit code, pool unchanged"),
        ("bad HTTP requests", r["bad_http"], "documented status and error code, daemon healthy"),
        ("concurrent streams", r["streams"], "each identical to its text alone"),
        ("disk and environment", r["disk"], "one error line each, nothing served from damage, nothing deleted"),
    ] + ([("daemon life", r["daemon_life"], "takeover, 8 concurrent pulls, stop waits")] if "daemon_life" in r else [])
    lines = [f"{'what':<24} {'tried':>5} {'ok':>5} {'lost':>5}  detail"]
    for what, t, detail in rows:
        lines.append(f"{what:<24} {t['tried']:>5} {t['ok']:>5} {t['lost']:>5}  {detail}")
    check = report["final_check"]
    resumed = " (resumed a killed pull's partial file)" if report["resumed_from_partial"] else ""
    lines.append(f"final `zenedge pool check --deep`: {'ok' if check.get('ok') else check.get('problems')}; "
                 f"pull after the kills: {'ok' if report['resumed_pull_ok'] else 'FAILED'}{resumed}; "
                 f"lost: {report['lost']}; {report['seconds']} s")
    for t in r.values():
        lines += [f"FAILED: {f}" for f in t["failures"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small version the test suite runs")
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    plan = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="zenedge-faults-") as tmp:
        report = run(Path(tmp), writer_kills_n=plan["writer_kills"], daemon_kills_n=plan["daemon_kills"],
                     streams=plan["streams"], cli=plan["cli"], throttle=plan["throttle"], heavy=not args.quick,
                     seed=args.seed, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(table(report))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
