"""Native /api endpoints against a real daemon: the pool through the same code paths as the CLI,
and changes that reach the daemon's memory (cache, budget, config) without a restart."""

from __future__ import annotations

import json
import time

from tests.server.harness import PROFILES, chat_body, write_config
from zenedge.api import wire


def eventually(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)
    return result


def test_health_list_ps_shapes(daemon):
    with daemon.uds() as http:
        health = wire.Health.model_validate(http.get("/health").json())
        assert health.uptime_seconds > 0 and len(health.home_id) == 16
        listed = wire.PoolList.model_validate(http.get("/api/list").json())
        assert [m.name for m in listed.models] == list(PROFILES)
        assert all(m.kind == "lora" and m.base == "tiny" and m.bytes > 0 for m in listed.models)
        http.post("/v1/chat/completions", json=chat_body("p0", "hi", max_tokens=2))
        ps = wire.Ps.model_validate(http.get("/api/ps").json())
    assert ps.device == "cpu" and ps.rss_bytes > 0
    assert {m.name for m in ps.models} == {"tiny", "p0"}  # Ollama's list, in the same body
    assert [b.name for b in ps.bases] == ["tiny"] and ps.bases[0].load_seconds > 0
    decode = ps.bases[0].decode       # the daemon's decode path: the tiny llama takes the lean forward
    assert decode.stepper == "static" and decode.forward == "lean" and decode.lean_refused is None
    assert decode.native_kernels == (decode.native_kernels_off is None)
    variant = next(v for v in ps.variants if "p0" in v.names)
    assert variant.kind == "lora" and variant.bytes > 0 and variant.load_seconds > 0
    assert ps.cache_used_bytes >= variant.bytes and ps.scheduler.max_queue == 64


def test_rm_removes_the_profile_and_its_cached_variant(fresh_daemon):
    daemon = fresh_daemon()
    with daemon.uds() as http:
        assert http.post("/v1/chat/completions", json=chat_body("p1", "hi", max_tokens=2)).status_code == 200
        assert any("p1" in v["names"] for v in http.get("/api/ps").json()["variants"])
        removed = wire.RmResult.model_validate(http.post("/api/rm", json={"name": "p1"}).json())
        assert removed.name == "p1" and removed.freed_bytes > 0
        assert not any("p1" in v["names"] for v in http.get("/api/ps").json()["variants"])
        assert http.post("/v1/chat/completions", json=chat_body("p1", "hi")).status_code == 404
        assert "p1" not in [m["id"] for m in http.get("/v1/models").json()["data"]]
        gone = http.post("/api/rm", json={"name": "p1"})
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "adapter_not_found"


def test_budget_get_dry_run_and_set(fresh_daemon):
    daemon = fresh_daemon(config={"runtime": {"pinned": ["p0"]}})
    with daemon.uds() as http:
        status = wire.BudgetStatus.model_validate(http.get("/api/budget").json())
        one = status.used_bytes // len(PROFILES)
        dry = http.put("/api/budget", json={"size": f"{2 * one}B", "dry_run": True}).json()
        assert dry["dry_run"] and len(dry["evict"]) == 2 and "p0" not in dry["evict"]
        assert len(http.get("/api/list").json()["models"]) == 4  # nothing changed
        done = wire.BudgetPlan.model_validate(http.put("/api/budget", json={"size": f"{2 * one}B"}).json())
        assert done.used_after <= 2 * one and done.evict == dry["evict"]
        assert http.get("/api/budget").json()["budget_bytes"] == 2 * one  # in force in the daemon
        assert "p0" in [m["name"] for m in http.get("/api/list").json()["models"]]
        bad = http.put("/api/budget", json={"size": "lots"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"
    assert f'budget = "{2 * one}B"' in daemon.config_path.read_text()  # and in the file


def test_config_edits_take_effect_without_restart(fresh_daemon):
    daemon = fresh_daemon()
    with daemon.uds() as http:
        one = http.get("/api/budget").json()["used_bytes"] // len(PROFILES)
        write_config(daemon.config_path, {"runtime": {"device": "cpu", "dtype": "float32", "cache_budget": "1MiB",
                                                      "pinned": ["p3"]},
                                          "server": {"max_queue": 5}, "pool": {"budget": f"{one}B"}})
        ps = eventually(lambda: (p := http.get("/api/ps").json())["scheduler"]["max_queue"] == 5 and p)
        assert ps["cache_budget_bytes"] == 2**20
        names = eventually(lambda: (n := [m["name"] for m in http.get("/api/list").json()["models"]]) == ["p3"] and n)
        assert names == ["p3"]  # the pinned one survives the lower budget
        reloads = eventually(lambda: http.get("/api/pool").json()["maintenance"]["config_reloads"])
        daemon.config_path.write_text("[pool]\nbudget = 'not a size'\n")  # a broken edit changes nothing
        time.sleep(0.6)
        assert http.get("/api/pool").json()["maintenance"]["config_reloads"] == reloads
        assert http.get("/api/ps").json()["scheduler"]["max_queue"] == 5
        assert http.get("/health").status_code == 200


def test_pool_status_and_maintain_now(fresh_daemon):
    daemon = fresh_daemon()
    with daemon.uds() as http:
        status = wire.PoolStatus.model_validate(http.get("/api/pool").json())
        assert status.adapters == len(PROFILES) and status.maintenance.available
        assert status.maintenance.last_run_at is None
        report = http.post("/api/pool").json()
        assert report["problems"] == [] and report["evicted"] == []
        after = http.get("/api/pool").json()["maintenance"]
        assert after["last_run_at"] is not None and after["last_result"]["problems"] == []


def test_background_maintenance_runs_on_its_interval(fresh_daemon):
    daemon = fresh_daemon(config={"pool": {"maintain_interval": 0.3}})
    with daemon.uds() as http:
        info = eventually(lambda: (m := http.get("/api/pool").json()["maintenance"])["last_run_at"] and m)
        assert info["last_error"] is None and info["last_result"]["problems"] == []


def test_pull_streams_progress_then_serves_the_profile(fresh_daemon, registry):
    daemon = fresh_daemon(config={"registry": {"urls": [registry]}})
    with daemon.uds() as http:
        with http.stream("POST", "/api/pull", json={"name": "writer"}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("application/x-ndjson")
            lines = [json.loads(line) for line in response.iter_lines() if line]
        assert any(line["status"] == "downloading" and line["total"] for line in lines[:-1])
        assert all(wire.PullProgress.model_validate(line).status for line in lines)  # each also an Ollama line
        final = wire.PullResult.model_validate(lines[-1])
        assert lines[-1]["status"] == "success" and final.name == "writer" and final.kind == "lora"
        assert http.post("/v1/chat/completions", json=chat_body("writer", "hi", max_tokens=4)).status_code == 200
        again = http.post("/api/pull", json={"name": "writer", "stream": False}).json()
        assert again["up_to_date"] is True and again["adapter_id"] == final.adapter_id
        assert again["status"] == "success"
        missing = http.post("/api/pull", json={"name": "ghost"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "profile_not_found", missing.text
        for body in ({}, {"name": "writer", "model": "other"}, {"name": "writer", "extra": 1}):
            assert http.post("/api/pull", json=body).status_code == 422


def test_progress_lines_are_valid_ollama_lines():
    from zenedge.server.native_routes import progress_line

    gate = progress_line({"phase": "gate", "completed": 2.0, "total": "3 profiles", "name": "writer"})
    assert gate == {"phase": "gate", "status": "gate", "completed": 2, "name": "writer"}
    assert progress_line({"status": "downloading", "sha256": "ab" * 32})["digest"] == "sha256:" + "ab" * 32
    kept = {"status": "checking quality of writer", "phase": "gate", "completed": 1, "total": 4}
    assert progress_line(kept) == kept
