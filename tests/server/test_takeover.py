"""`zenedge serve` takes over from a daemon that a command started on demand (the README's quick
start, `pull`, then its "From apps" section, `serve --tcp`), and never from one `serve` started."""

from __future__ import annotations

import os
import signal

import ollama
from openai import OpenAI

from tests.conftest import run_cli
from tests.server.harness import ProcessDaemon, make_home
from tests.server.test_autostart import alive, wait_gone
from zenedge.api import discovery


def test_serve_takes_over_from_a_daemon_a_command_started_and_serves_both_apis(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    env = {"ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "XDG_RUNTIME_DIR": "",
           "ZENEDGE_KEEP_ALIVE": "120", "OMP_NUM_THREADS": "1"}
    alone = run_cli("run", "p0", "hi", "--max-tokens", "4", env=env, check=True)   # starts one on demand
    on_demand = discovery.read_info(home)["pid"]
    served = ProcessDaemon.start(home, config_path)
    try:
        wait_gone(on_demand)
        assert served.process.pid != on_demand and discovery.read_info(home)["pid"] == served.process.pid
        openai = OpenAI(base_url=f"{served.tcp_url}/v1", api_key=served.token)
        answer = openai.chat.completions.create(model="p0", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=4, temperature=0)
        assert answer.choices[0].message.content == alone.stdout.rstrip("\n")  # same greedy answer
        client = ollama.Client(host=served.tcp_url, headers={"Authorization": f"Bearer {served.token}"})
        assert client.chat(model="p0", messages=[{"role": "user", "content": "hi"}],
                           options={"num_predict": 4, "temperature": 0}).message.content == answer.choices[0].message.content

        second = run_cli("serve", env={**env, "ZENEDGE_KEEP_ALIVE": "0"})        # a daemon `serve` started stays
        assert second.returncode == 1 and second.stderr.count("\n") == 1
        assert second.stderr.startswith(f"error: a zenedge daemon is already running for this home (pid {served.process.pid}")
        assert "started by `zenedge serve` (use it, or stop it first with `zenedge stop`)" in second.stderr
        assert alive(served.process.pid)
    finally:
        served.signal(signal.SIGTERM)
        assert served.wait() == 0
    stderr = served.process.stderr.read()
    assert f"taking over from the zenedge daemon a command started (pid {on_demand})" in stderr


def test_a_daemon_started_on_demand_never_displaces_another(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    env = {"ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "XDG_RUNTIME_DIR": "",
           "ZENEDGE_KEEP_ALIVE": "120", "OMP_NUM_THREADS": "1"}
    run_cli("run", "p0", "hi", "--max-tokens", "2", env=env, check=True)
    first = discovery.read_info(home)["pid"]
    try:
        again = run_cli("serve", "--idle-exit", "60", env=env)
        assert again.returncode == 1 and "already running for this home" in again.stderr
        assert alive(first) and discovery.read_info(home)["pid"] == first
    finally:
        os.kill(first, signal.SIGTERM)
        wait_gone(first)
