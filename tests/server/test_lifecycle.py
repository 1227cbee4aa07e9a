"""`zenedge serve` as a process: one daemon per home, a crashed daemon's socket replaced, SIGHUP
reloads the config, SIGTERM drains in-flight requests and exits 0 without leaving its socket."""

from __future__ import annotations

import json
import signal
import stat
import time

from tests.conftest import run_cli
from tests.server.harness import ProcessDaemon, chat_body, make_home, write_config
from zenedge.api import discovery


def stream_lines(client, body):
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        yield from (line for line in response.iter_lines() if line)


def test_serve_lifecycle(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    first = ProcessDaemon.start(home, config_path, "--config-poll", "0")  # config changes: SIGHUP only
    try:
        assert stat.S_IMODE(first.socket.stat().st_mode) == 0o600
        with first.tcp() as http:
            assert http.post("/v1/chat/completions", json=chat_body("p0", "hi", max_tokens=4)).status_code == 200

        second = run_cli("serve", env=first.env())
        assert second.returncode == 1
        assert second.stderr.splitlines() == [
            f"error: a zenedge daemon is already running for this home (pid {first.process.pid}, socket {first.socket}), "
            "started by `zenedge serve` (use it, or stop it first with `zenedge stop`)"]

        write_config(config_path, {"runtime": {"device": "cpu", "dtype": "float32"}, "server": {"max_queue": 7}})
        with first.uds() as http:
            assert http.get("/api/ps").json()["scheduler"]["max_queue"] == 64  # not watched: unchanged
        first.signal(signal.SIGHUP)
        with first.uds() as http:
            deadline = time.monotonic() + 30
            while http.get("/api/ps").json()["scheduler"]["max_queue"] != 7:
                assert time.monotonic() < deadline, "SIGHUP did not reload the config"
                time.sleep(0.05)

        first.signal(signal.SIGKILL)  # a crash: no cleanup at all
        first.wait()
        assert first.socket.exists()
    finally:
        first.kill()

    restarted = ProcessDaemon.start(home, config_path, "--grace", "30")
    try:
        assert restarted.socket == first.socket
        with restarted.uds() as http:
            assert http.get("/health").json()["pid"] == restarted.process.pid
            lines = stream_lines(http, chat_body("forever", "a long answer", max_tokens=150))
            next(lines)  # in flight
            restarted.signal(signal.SIGTERM)
            rest = list(lines)
        assert rest[-1] == "data: [DONE]"
        finish = [json.loads(line[6:])["choices"][0].get("finish_reason") for line in rest[:-1]]
        assert finish[-1] == "length"  # it ran to the end, within the grace period
        assert restarted.wait() == 0
    finally:
        restarted.kill()
    stderr = restarted.process.stderr.read()
    assert "removed a stale socket" in stderr
    assert not restarted.socket.exists() and discovery.read_info(home) is None


def test_grace_period_ends_what_is_left_and_still_exits_0(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    daemon = ProcessDaemon.start(home, config_path, "--grace", "1")
    try:
        with daemon.uds() as http:
            lines = stream_lines(http, chat_body("forever", "never ends", max_tokens=65536))
            next(lines)
            daemon.signal(signal.SIGTERM)
            rest = list(lines)
        assert rest[-1] == "data: [DONE]"  # ended properly, and says why
        assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "cancelled"
        assert daemon.wait() == 0
    finally:
        daemon.kill()
    assert not daemon.socket.exists()
