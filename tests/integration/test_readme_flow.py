"""The README's flows in order, on a fresh home, as a new user runs them: the quick start (`pull
writer`, which starts a daemon on demand, then `run`), then "From apps" (`zenedge serve --tcp`) with
the official `openai` and `ollama` clients."""

from __future__ import annotations

import signal

import ollama
import pytest
from openai import OpenAI

from tests.conftest import run_cli
from tests.server.harness import ProcessDaemon
from tests.server.test_autostart import wait_gone
from zenedge.api import discovery

pytestmark = pytest.mark.slow


def test_quick_start_then_serve_for_apps(tmp_path):
    home, config_path = tmp_path / "home", tmp_path / "config.toml"
    env = {"ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "XDG_RUNTIME_DIR": "",
           "ZENEDGE_KEEP_ALIVE": "300"}       # the default a user has (the suite sets 0)
    pulled = run_cli("pull", "writer", env=env, check=True)
    assert "pulled writer" in pulled.stdout and "starting a zenedge daemon" in pulled.stderr
    ran = run_cli("run", "writer", "Explain what a Python generator is.", "--max-tokens", "24", env=env, check=True)
    assert ran.stdout.strip()
    on_demand = discovery.read_info(home)["pid"]

    served = ProcessDaemon.start(home, config_path)           # `zenedge serve --tcp 127.0.0.1:…`
    try:
        wait_gone(on_demand)
        client = OpenAI(base_url=f"{served.tcp_url}/v1", api_key=served.token)
        chunks = client.chat.completions.create(model="writer", stream=True, max_tokens=16,
                                                messages=[{"role": "user", "content": "Explain generators."}])
        assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices).strip()
        local = ollama.Client(host=served.tcp_url, headers={"Authorization": f"Bearer {served.token}"})
        reply = local.chat(model="writer", messages=[{"role": "user", "content": "Explain generators."}],
                           options={"num_predict": 16})
        assert reply.done and reply.message.content.strip()
        assert len(local.embed(model="writer", input=["one text", "another"]).embeddings) == 2
    finally:
        served.signal(signal.SIGTERM)
        assert served.wait() == 0
