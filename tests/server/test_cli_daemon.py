"""The CLI through a running daemon (`run`, `rm`, `budget set`, `ps`), and finding it cheaply."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from tests.conftest import run_cli
from tests.server.harness import PROFILES, chat_body
from zenedge import config
from zenedge.api import client as api_client
from zenedge.api import discovery, wire
from zenedge.cli.daemon import find_daemon


def completed(daemon) -> int:
    with daemon.uds() as http:
        return http.get("/api/ps").json()["scheduler"]["completed"]


def test_ps_without_a_daemon_says_so():
    result = run_cli("ps")
    assert result.returncode == 3
    assert result.stderr.strip() == "error: no zenedge daemon is running (start one with `zenedge serve`)"


def test_ps_through_the_daemon(daemon):
    status = json.loads(run_cli("ps", "--json", env=daemon.env(), check=True).stdout)
    assert status["scheduler"]["max_queue"] == 64 and "variants" in status
    table = run_cli("ps", env=daemon.env(), check=True).stdout
    assert "running" in table and "queued" in table


def test_doctor_reports_the_daemon_decode_path(daemon):
    """With a daemon up, doctor reports the path its loaded bases decode with, as /api/ps gives it."""
    with daemon.uds() as http:
        http.post("/v1/chat/completions", json=chat_body("p0", "hi", max_tokens=2))
        decode = http.get("/api/ps").json()["bases"][0]["decode"]
    checks = json.loads(run_cli("doctor", "--json", env=daemon.env()).stdout)
    path = next(c for c in checks if c["check"] == "decode path (tiny, daemon)")
    assert path["detail"].startswith(f"static stepper, lean forward, {decode['weights']} weights")


def test_run_goes_through_the_daemon_with_the_same_answer(daemon):
    before = completed(daemon)
    printed = run_cli("run", "p1", "tell me a story", "--max-tokens", "12", env=daemon.env(), check=True).stdout
    as_json = json.loads(run_cli("run", "p1", "tell me a story", "--max-tokens", "12", "--json",
                                 env=daemon.env(), check=True).stdout)
    raw = run_cli("run", "p1", "Once", "--raw", "--max-tokens", "6", env=daemon.env(), check=True).stdout
    assert completed(daemon) == before + 3  # all three ran in the daemon
    with daemon.uds() as http:
        expected = http.post("/v1/chat/completions", json=chat_body("p1", "tell me a story")).json()
        raw_expected = http.post("/v1/completions", json={"model": "p1", "prompt": "Once", "max_tokens": 6,
                                                          "temperature": 0}).json()
    assert printed == expected["choices"][0]["message"]["content"] + "\n"
    assert as_json == {"model": "p1", "text": expected["choices"][0]["message"]["content"],
                       "prompt_tokens": expected["usage"]["prompt_tokens"],
                       "completion_tokens": expected["usage"]["completion_tokens"],
                       "finish_reason": expected["choices"][0]["finish_reason"]}
    assert raw == raw_expected["choices"][0]["text"] + "\n"
    missing = run_cli("run", "ghost", "hi", env=daemon.env())
    assert missing.returncode == 1 and missing.stderr.startswith("error: 'ghost' is not in the pool")


def test_rm_and_budget_set_go_through_the_daemon(fresh_daemon):
    daemon = fresh_daemon()
    with daemon.uds() as http:
        http.post("/v1/chat/completions", json=chat_body("p2", "hi", max_tokens=2))
        out = run_cli("rm", "p2", env=daemon.env(), check=True).stdout
        assert out.startswith("removed p2; freed")
        assert not any("p2" in v["names"] for v in http.get("/api/ps").json()["variants"])  # left memory too
        used = http.get("/api/budget").json()["used_bytes"]
        plan = json.loads(run_cli("budget", "set", f"{used}B", "--json", env=daemon.env(), check=True).stdout)
        assert plan["budget_bytes"] == used and plan["evict"] == []
        assert http.get("/api/budget").json()["budget_bytes"] == used  # in force in the daemon at once
        human = run_cli("budget", "set", "1B", "--dry-run", env=daemon.env(), check=True).stdout
        assert "would evict" in human and all(p in human for p in ("p0", "p1", "p3"))
        assert len(http.get("/api/list").json()["models"]) == len(PROFILES) - 1


def test_every_command_that_changes_the_pool_goes_through_the_running_daemon(fresh_daemon):
    daemon = fresh_daemon()
    env = {**daemon.env(), "ZENEDGE_KEEP_ALIVE": "0"}       # the daemon is found, none is started

    def jobs_done(http) -> int:
        return http.get("/api/pool").json()["jobs"]["done"]

    with daemon.uds() as http:
        steps = [(["pin", "p0"], "pinned p0\n"), (["unpin", "p0"], "unpinned p0\n"),
                 (["merge", "p1", "p2", "--force", "--json"], None), (["pool", "maintain", "--json"], None),
                 (["budget", "set", "1GiB"], None), (["rm", "p3"], None)]
        for args, expected in steps:
            before = jobs_done(http)
            done = run_cli(*args, env=env, check=True)
            assert expected is None or done.stdout == expected
            assert jobs_done(http) == before + 1, args            # ran as one of the daemon's pool jobs
        merged = {m["name"]: m["served_by"] for m in http.get("/api/list").json()["models"]}
        assert merged["p1"] == merged["p2"] and "p3" not in merged
        pinned = http.post("/api/pin", json={"name": "p0"}).json()
        assert pinned["pinned"] is True and pinned["name"] == "p0"
        assert http.post("/api/pin", json={"name": "p0", "forever": True}).status_code == 422


def test_find_daemon(daemon, isolated_home, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")
    cfg = config.load()
    assert find_daemon(cfg) is None  # no socket: one stat, nothing else
    path = discovery.socket_for(cfg).path
    path.parent.mkdir(parents=True, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # what a crashed daemon leaves
    assert path.exists() and find_daemon(cfg) is None
    # a daemon that serves another home, even on our socket path, is not ours
    config_path = tmp_path / "other.toml"
    config_path.write_text(f'[server]\nsocket = "{daemon.socket}"\n')
    assert find_daemon(config.load(config_path)) is None
    monkeypatch.setenv("ZENEDGE_HOME", str(daemon.home))
    found = find_daemon(config.load(config_path))
    assert found is not None and found.health()["home_id"] == discovery.home_id(daemon.home)


def test_finding_a_daemon_imports_only_the_stdlib_client():
    code = ("import sys, zenedge.cli, zenedge.cli.daemon; from zenedge.cli.daemon import find_daemon; find_daemon(); "
            "print(' '.join(m for m in ('torch', 'transformers', 'fastapi', 'uvicorn', 'starlette', 'httpx', "
            "'pydantic', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_client_request_bodies_fit_the_wire_contract():
    body = api_client.sampling_body("p0", max_tokens=5, temperature=0.0, top_p=0.9, seed=3, stop=("\n",))
    wire.ChatCompletionRequest.model_validate({**body, "messages": [{"role": "user", "content": "hi"}],
                                               "stream": True, "stream_options": {"include_usage": True}})
    wire.CompletionRequest.model_validate({**body, "prompt": "hi"})
    wire.RmRequest.model_validate({"name": "p0"})
    wire.BudgetRequest.model_validate({"size": "1GiB", "dry_run": False})
    wire.PullRequest.model_validate({"name": "writer", "stream": True})
    wire.PinRequest.model_validate({"name": "p0", "pinned": False})
    wire.MergeRequest.model_validate({"names": ["p0", "p1"], "method": "opcm", "force": False, "stream": True})


def test_wire_errors_become_the_same_zenedge_errors():
    from zenedge.errors import AdapterNotFound, BudgetExceeded, ZenedgeError

    error = api_client.error_from_wire(404, {"error": {"code": "adapter_not_found", "message": "gone", "hint": "h"}})
    assert type(error) is AdapterNotFound and str(error) == "gone (h)" and error.exit_code == 1
    assert type(api_client.error_from_wire(507, {"error": {"code": "budget_exceeded", "message": "x"}})) \
        is BudgetExceeded
    odd = api_client.error_from_wire(502, "<html>bad gateway</html>")
    assert type(odd) is ZenedgeError and "502" in str(odd)


def test_import_goes_through_the_daemon_and_only_over_its_socket(fresh_daemon, tmp_path, tiny_base_dir):
    import os

    from tests.conftest import tiny_module_shapes, write_lora_dir

    daemon = fresh_daemon()
    lora = write_lora_dir(tmp_path / "lora-new", tiny_module_shapes(tiny_base_dir), seed=42, scale=0.3)
    with daemon.tcp() as http:  # it reads files on the daemon's machine: not over TCP, token or not
        refused = http.post("/api/import", json={"path": str(lora), "name": "newp"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    with daemon.uds() as http:
        relative = http.post("/api/import", json={"path": "lora-new", "name": "newp"})
        assert relative.status_code == 400 and "absolute path" in relative.json()["error"]["message"]
        before = http.get("/api/ps").json()["uptime_seconds"]
    # A relative path on the command line is this process's: the CLI resolves it before asking.
    result = json.loads(run_cli("import", os.path.relpath(lora), "--name", "newp", "--base", "tiny", "--json",
                                env=daemon.env(), check=True).stdout)
    assert result["name"] == "newp" and result["kind"] == "lora"
    with daemon.uds() as http:
        names = [m["name"] for m in http.get("/api/list").json()["models"]]
        assert "newp" in names and http.get("/api/ps").json()["uptime_seconds"] > before  # the same daemon
    missing = run_cli("import", str(tmp_path / "nowhere"), "--name", "other", "--base", "tiny", env=daemon.env())
    local = run_cli("import", str(tmp_path / "nowhere"), "--name", "other", "--base", "tiny")  # no daemon there
    assert (missing.returncode, missing.stderr) == (local.returncode, local.stderr) and missing.returncode == 2


def test_compress_goes_through_the_daemon_and_only_over_its_socket(fresh_daemon, tmp_path, tiny_base_dir):
    from tests.runtime.test_bitdelta_runtime import fine_tune_copy

    daemon = fresh_daemon()
    finetuned = fine_tune_copy(tiny_base_dir, tmp_path / "ft", seed=5)
    env = {**daemon.env(), "ZENEDGE_KEEP_ALIVE": "0"}
    with daemon.uds() as http:
        before = http.get("/api/pool").json()["jobs"]["done"]
        done = run_cli("compress", "--finetuned", str(finetuned), "--name", "full", "--base", "tiny", env=env, check=True)
        assert done.stdout.startswith("stored full (bitdelta") and "compressing 100%" in done.stderr
        assert http.get("/api/pool").json()["jobs"]["done"] == before + 1
        assert {m["name"]: m["kind"] for m in http.get("/api/list").json()["models"]}["full"] == "bitdelta"
    with daemon.tcp() as http:
        refused = http.post("/api/compress", json={"finetuned": str(finetuned), "name": "again", "base": "tiny"})
        assert refused.status_code == 403
