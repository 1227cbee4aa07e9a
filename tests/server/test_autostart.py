"""`pull` and `run` start a daemon that outlives them (server.keep_alive), the daemon leaves once idle
for that long, and `zenedge stop` / POST /api/stop end one at once."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx

from tests.conftest import run_cli
from tests.server.harness import ProcessDaemon, make_home, write_config
from zenedge.api import discovery


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has exited)."""
    from zenedge.cli.daemon import exited

    return not exited(pid)


def wait_gone(pid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} is still running"
        time.sleep(0.05)


def test_run_starts_a_daemon_that_serves_the_next_commands_until_stopped(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    env = {"ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "XDG_RUNTIME_DIR": "",
           "OMP_NUM_THREADS": "1"}
    local = run_cli("run", "p0", "hi", "--max-tokens", "3", env={**env, "ZENEDGE_KEEP_ALIVE": "0"}, check=True)
    assert "daemon" not in local.stderr and discovery.read_info(home) is None  # 0: never started

    env["ZENEDGE_KEEP_ALIVE"] = "120"
    first = run_cli("run", "p0", "hi", "--max-tokens", "3", env=env, check=True)
    info = discovery.read_info(home)
    try:
        assert "starting a zenedge daemon for this pool (it exits after 120 s" in first.stderr
        assert info is not None and alive(info["pid"])
        assert first.stdout == local.stdout  # the same greedy answer, generated in the daemon
        second = run_cli("run", "p1", "hi", "--max-tokens", "3", env=env, check=True)
        assert "starting" not in second.stderr  # found the running one
        with httpx.Client(transport=httpx.HTTPTransport(uds=info["socket"]), base_url="http://localhost") as http:
            assert http.get("/api/ps").json()["scheduler"]["completed"] == 2  # both ran there
        assert run_cli("stop", env=env, check=True).stdout == f"stopped the zenedge daemon (pid {info['pid']})\n"
        assert not alive(info["pid"])          # `stop` returns once the process has exited
        assert discovery.read_info(home) is None and not os.path.exists(info["socket"])
        assert run_cli("stop", env=env, check=True).stdout == "no zenedge daemon is running\n"
    finally:
        if info is not None and alive(info["pid"]):
            os.kill(info["pid"], signal.SIGKILL)
    assert (home / "logs" / "daemon.log").read_text().count(") serving") == 1


def test_a_daemon_that_cannot_start_leaves_the_work_to_the_command(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    write_config(config_path, {"runtime": {"device": "cpu", "dtype": "float32"},
                               "server": {"socket": str(blocker / "zenedge.sock")}})  # no socket can go there
    env = {"ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "ZENEDGE_KEEP_ALIVE": "60"}
    done = run_cli("run", "p0", "hi", "--max-tokens", "3", "--json", env=env, check=True)
    assert '"completion_tokens": 3' in done.stdout
    log = (home / "logs" / "daemon.log").read_text()
    last = log.strip().splitlines()[-1].strip()
    assert last.startswith("error:")
    # the daemon's own last word, in the command that started it (not only "see the log")
    assert f"note: the zenedge daemon did not start ({last}); see {home / 'logs' / 'daemon.log'}; " \
           "working in this process" in done.stderr


def test_an_invalid_keep_alive_is_a_one_line_error(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    env = {"ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "ZENEDGE_KEEP_ALIVE": "soon"}
    done = run_cli("run", "p0", "hi", env=env)
    assert done.returncode != 0
    assert done.stderr == "error: ZENEDGE_KEEP_ALIVE='soon': expected a number of seconds\n"


def test_an_idle_daemon_exits_on_its_own_and_a_busy_one_does_not(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    daemon = ProcessDaemon.start(home, config_path, "--idle-exit", "1.5")
    try:
        with daemon.uds() as http:
            with http.stream("POST", "/v1/chat/completions", json={
                    "model": "forever", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 3000,
                    "stream": True}) as response:
                lines = response.iter_lines()
                next(lines)
                time.sleep(3.0)  # the request stays in flight twice the idle time: not idleness
                assert daemon.process.poll() is None
                assert sum(1 for line in lines if line) > 100
        assert daemon.wait(timeout=60) == 0  # then, 1.5 s after the last request, a clean exit
        assert not daemon.socket.exists() and discovery.read_info(home) is None
    finally:
        daemon.kill()


def test_api_stop_drains_and_exits_0(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    daemon = ProcessDaemon.start(home, config_path)
    try:
        with daemon.uds() as http:
            answer = http.post("/api/stop").json()
        assert answer == {"status": "stopping", "pid": daemon.process.pid, "grace_seconds": 10.0}
        assert daemon.wait(timeout=60) == 0
        assert not daemon.socket.exists()
    finally:
        daemon.kill()


def test_pull_starts_one_too_and_reports_the_same_result(tmp_path, tiny_base_dir, registry):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    write_config(config_path, {"runtime": {"device": "cpu", "dtype": "float32"}, "registry": {"urls": [registry]}})
    env = {"ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "XDG_RUNTIME_DIR": "",
           "ZENEDGE_KEEP_ALIVE": "120"}
    done = run_cli("pull", "writer", "--json", env=env, check=True)
    info = discovery.read_info(home)
    try:
        assert "starting a zenedge daemon" in done.stderr and info is not None
        result = json.loads(done.stdout)
        assert result["name"] == "writer" and result["kind"] == "lora" and not result["up_to_date"]
        again = json.loads(run_cli("pull", "writer", "--json", env=env, check=True).stdout)
        assert again["up_to_date"] and again["adapter_id"] == result["adapter_id"]
    finally:
        run_cli("stop", env=env)
        if info is not None:
            wait_gone(info["pid"])


def test_run_in_a_home_without_a_base_starts_no_daemon(tmp_path):
    """The first `run` of a fresh home would convert the default base: it does that here, with its
    progress on the terminal, rather than silently in a daemon (here it stops earlier: no such profile)."""
    env = {"ZENEDGE_HOME": str(tmp_path / "home"), "ZENEDGE_CONFIG": str(tmp_path / "config.toml"),
           "ZENEDGE_KEEP_ALIVE": "120"}
    done = run_cli("run", "p0", "hi", env=env)
    assert done.returncode == 1 and done.stderr.startswith("error: 'p0' is not in the pool")
    assert "daemon" not in done.stderr and discovery.read_info(tmp_path / "home") is None


def test_two_commands_starting_at_once_share_one_daemon(tmp_path, tiny_base_dir):
    import subprocess
    import sys

    home, config_path = make_home(tmp_path, tiny_base_dir)
    env = {**os.environ, "ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "XDG_RUNTIME_DIR": "",
           "ZENEDGE_KEEP_ALIVE": "120", "OMP_NUM_THREADS": "1"}
    commands = [subprocess.Popen([sys.executable, "-m", "zenedge.cli", "run", name, "hi", "--max-tokens", "3", "--json"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for name in ("p0", "p1")]
    outputs = [command.communicate(timeout=300) for command in commands]
    info = discovery.read_info(home)
    try:
        assert [command.returncode for command in commands] == [0, 0], outputs
        assert info is not None and alive(info["pid"])
        with httpx.Client(transport=httpx.HTTPTransport(uds=info["socket"]), base_url="http://localhost") as http:
            assert http.get("/api/ps").json()["scheduler"]["completed"] == 2  # both went through the one daemon
        # Both may have started one; a second is refused by the home's lock and exits.
        log = (home / "logs" / "daemon.log").read_text()
        assert log.count(f"daemon (pid {info['pid']}) serving") == 1 and log.count(") serving") == 1
    finally:
        run_cli("stop", env=env)
        if info is not None:
            wait_gone(info["pid"])


def test_a_daemon_started_in_a_folder_of_decoys_imports_only_the_installation(tmp_path, tiny_base_dir):
    """Regression: `pull` in a clone's root started `python -m zenedge.cli serve` there, so the
    clone's kernels/ (then a package) shadowed PyPI's `kernels` inside the daemon. From a folder
    whose `kernels` and `zenedge` packages fail on import, the command (the installed entry point,
    as a user types it) still starts a daemon that serves it."""
    import subprocess
    import sys
    from pathlib import Path

    home, config_path = make_home(tmp_path, tiny_base_dir)
    workdir = tmp_path / "clone"
    for decoy in ("kernels", "zenedge"):
        (workdir / decoy).mkdir(parents=True)
        (workdir / decoy / "__init__.py").write_text(f"raise ImportError('the decoy {decoy} was imported')\n")
    (workdir / "zenedge" / "cli.py").write_text("raise ImportError('the decoy zenedge.cli was imported')\n")
    env = {**os.environ, "ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "XDG_RUNTIME_DIR": "",
           "OMP_NUM_THREADS": "1", "ZENEDGE_KEEP_ALIVE": "120"}
    entry_point = Path(sys.executable).with_name("zenedge")
    done = subprocess.run([str(entry_point), "run", "p0", "hi", "--max-tokens", "3"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)
    info = discovery.read_info(home)
    try:
        assert done.returncode == 0, done.stderr
        assert "starting a zenedge daemon" in done.stderr and "did not start" not in done.stderr, done.stderr
        assert info is not None and alive(info["pid"])
        assert "decoy" not in (home / "logs" / "daemon.log").read_text()
    finally:
        if info is not None and alive(info["pid"]):
            os.kill(info["pid"], signal.SIGKILL)
