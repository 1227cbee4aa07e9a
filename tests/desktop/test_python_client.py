"""The torch-free Python client (desktop/python, imported by path as a desktop app would vendor it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

CLIENT_PATH = REPO / "desktop" / "python"
sys.path.insert(0, str(CLIENT_PATH))

import zenedge_client  # noqa: E402
from zenedge_client import DaemonUnavailable, ZenedgeClient, ZenedgeError, discover  # noqa: E402

STORY = {"model": "p1", "messages": [{"role": "user", "content": "tell me a story"}], "temperature": 0,
         "max_tokens": 24}


@pytest.fixture(params=["unix", "tcp"])
def client(request, daemon):
    made = (ZenedgeClient.unix(str(daemon.socket)) if request.param == "unix"
            else ZenedgeClient.tcp(daemon.tcp_url, daemon.token))
    with made:
        yield made


def test_importing_the_client_loads_neither_torch_nor_zenedge():
    code = ("import sys, zenedge_client; "
            "print(' '.join(m for m in ('torch', 'zenedge', 'numpy', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(CLIENT_PATH)}).stdout.strip()
    assert out == ""


def test_health_models_and_native_endpoints(client, daemon):
    assert client.health()["status"] == "ok"
    assert {"tiny", "p0", "p1", "p2", "p3"} <= {m["id"] for m in client.models()["data"]}
    assert [m["name"] for m in client.list()["models"]] == ["p0", "p1", "p2", "p3"]
    assert client.ps()["scheduler"]["max_queue"] == 64
    assert client.set_budget("1B", dry_run=True)["dry_run"] is True
    assert client.pool()["adapters"] == 4 and client.budget()["used_bytes"] > 0


def test_streamed_chat_and_completions_equal_plain(client):
    plain = client.chat(STORY)
    chunks = list(client.chat_stream({**STORY, "stream_options": {"include_usage": True}}))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == \
        plain["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == plain["usage"]
    request = {"model": "p2", "prompt": "Once upon a time", "temperature": 0, "max_tokens": 12}
    assert "".join(c["choices"][0]["text"] for c in client.complete_stream(request)) == \
        client.complete(request)["choices"][0]["text"]


def test_embeddings(client):
    answer = client.embeddings({"model": "p0", "input": ["hello there", "general kenobi"]})
    assert [d["index"] for d in answer["data"]] == [0, 1]
    assert all(len(d["embedding"]) == 64 and abs(sum(x * x for x in d["embedding"]) - 1) < 1e-5
               for d in answer["data"])
    assert answer["usage"]["prompt_tokens"] == len("hello there") + len("general kenobi")


def test_errors_keep_status_and_code(client, daemon):
    with pytest.raises(ZenedgeError) as caught:
        client.chat({**STORY, "model": "ghost"})
    assert (caught.value.status, caught.value.code) == (404, "adapter_not_found")
    with pytest.raises(ZenedgeError) as caught:
        list(client.chat_stream({**STORY, "model": "ghost"}))
    assert caught.value.status == 404
    with ZenedgeClient.tcp(daemon.tcp_url, "wrong") as wrong, pytest.raises(ZenedgeError) as caught:
        wrong.ps()
    assert (caught.value.status, caught.value.code) == (401, "unauthorized")
    with ZenedgeClient.unix(str(daemon.home / "nothing.sock")) as gone, pytest.raises(DaemonUnavailable):
        gone.health()


def test_closing_a_stream_early_cancels_its_generation(daemon):
    with ZenedgeClient.unix(str(daemon.socket)) as client:
        before = client.ps()["scheduler"]["cancelled"]
        stream = client.chat_stream({"model": "forever", "messages": [{"role": "user", "content": "go"}],
                                     "max_tokens": 65536})
        for _ in zip(range(3), stream):
            pass
        stream.close()
        deadline = time.monotonic() + 60
        while (stats := client.ps()["scheduler"])["running"]:
            assert time.monotonic() < deadline, "still generating: the stream was not cancelled"
            time.sleep(0.05)
        assert stats["cancelled"] == before + 1


def test_discover_through_daemon_json(daemon, monkeypatch):
    monkeypatch.setenv("ZENEDGE_TOKEN", daemon.token)
    for prefer_tcp, prefix in ((False, "unix:"), (True, "http:")):
        found = discover(daemon.home, prefer_tcp=prefer_tcp)
        assert found is not None and found.where.startswith(prefix)
        assert found.health()["pid"] == os.getpid()  # the daemon runs inside this test process
        found.close()
    assert discover(daemon.home / "elsewhere") is None
    monkeypatch.setenv("ZENEDGE_HOME", str(daemon.home))
    assert zenedge_client.default_home() == daemon.home
