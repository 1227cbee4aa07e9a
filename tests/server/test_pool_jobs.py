"""The daemon's pool work queue (server/pool_jobs.py): one job at a time in order, waiting jobs told
what they wait for, a stop that leaves the pool unchanged, and concurrent pulls that never time out."""

from __future__ import annotations

import json
import threading

import pytest

from tests.conftest import tiny_module_shapes, write_lora_dir
from tests.registry.server import serve_registry
from tests.server.harness import ThreadDaemon, make_home, one_torch_thread, write_config
from zenedge.server.errors import ShuttingDown
from zenedge.server.pool_jobs import PoolJobs


def test_jobs_run_one_at_a_time_in_order_and_waiting_ones_hear_why():
    jobs = PoolJobs()
    started, release, order, heard = threading.Event(), threading.Event(), [], {}

    def job(name):
        def work(progress):
            order.append(name)
            if name == "first":
                started.set()
                release.wait(10)
            return name
        return work

    first = jobs.submit("pull first", job("first"))
    assert started.wait(10) and jobs.current == "pull first"
    later = [jobs.submit(f"pull {n}", job(n), progress=lambda e, n=n: heard.setdefault(n, []).append(e["status"]))
             for n in ("second", "third")]
    release.set()
    assert [f.result(10) for f in [first, *later]] == ["first", "second", "third"]
    assert order == ["first", "second", "third"]
    assert heard["second"][0] == "waiting for pull first"
    assert heard["third"][0] == "waiting for pull first and 1 more"
    assert jobs.join(10)


def test_a_stop_refuses_waiting_jobs_and_ends_the_running_one_at_a_safe_point():
    jobs = PoolJobs()
    started, proceed, committed = threading.Event(), threading.Event(), []

    def merging(progress):
        started.set()
        proceed.wait(10)
        progress({"status": "checking quality of writer", "phase": "gate"})   # stops here
        committed.append(True)

    def committing(progress):
        progress({"status": "storing", "phase": "commit"})                    # past the safe points: runs on
        return "stored"

    running = jobs.submit("pull writer", merging)
    started.wait(10)
    waiting = jobs.submit("pull coder", committing)
    jobs.stop()
    proceed.set()
    with pytest.raises(ShuttingDown, match="before this job started"):
        waiting.result(10)
    with pytest.raises(ShuttingDown, match="stopped during pull writer"):
        running.result(10)
    assert committed == [] and jobs.join(10)
    with pytest.raises(ShuttingDown):
        jobs.submit("pull late", committing)

    later = PoolJobs()
    later.stop()
    assert later.join(10)


@pytest.fixture
def registry_of_eight(tmp_path, tiny_base_dir):
    from zenedge.registry.builder import build_registry
    from zenedge.store import Store

    home, config_path = make_home(tmp_path, tiny_base_dir, profiles=())
    base_sha = Store(home).base("tiny")["sha256"]
    root = tmp_path / "registry"
    shapes = tiny_module_shapes(tiny_base_dir)
    for i in range(8):
        folder = root / f"r{i}"
        write_lora_dir(folder / "adapter", shapes, seed=100 + i, rank=4, scale=0.3)
        (folder / "eval.jsonl").write_text("".join(json.dumps({"prompt": f"q{j}", "answer": f"a{j}"}) + "\n"
                                                   for j in range(16)))
        (folder / "recipe.json").write_text(json.dumps({
            "name": f"r{i}", "version": "1.0.0", "description": "a test profile", "kind": "lora", "license": "CC0-1.0",
            "metric": "exact_match", "base": {"name": "tiny", "sha256": base_sha}}))
    build_registry(root)
    return home, config_path, root


def test_eight_concurrent_pulls_through_one_daemon_all_finish(registry_of_eight):
    home, config_path, root = registry_of_eight
    with serve_registry(root) as (url, _), one_torch_thread():
        one = (root / "r0" / "adapter" / "adapter_model.safetensors").stat().st_size
        write_config(config_path, {"runtime": {"device": "cpu", "dtype": "float32"},
                                   "pool": {"budget": f"{int(one * 4.5)}B", "on_no_merge": "evict"},
                                   "registry": {"urls": [url]}})
        daemon = ThreadDaemon.start(home, config_path)
        outcomes, waited = {}, []
        try:
            def pull(name):
                with daemon.uds(timeout=300) as http, http.stream("POST", "/api/pull", json={"name": name}) as answer:
                    assert answer.status_code == 200, answer.read()
                    lines = [json.loads(line) for line in answer.iter_lines() if line]
                waited.extend(line for line in lines if line.get("phase") == "queue")
                last = lines[-1]
                outcomes[name] = last.get("status") if "error" not in last else last["error"]["code"]

            threads = [threading.Thread(target=pull, args=(f"r{i}",)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(600)
            with daemon.uds() as http:
                listed = {entry["name"] for entry in http.get("/api/list").json()["models"]}
        finally:
            daemon.stop()
    assert set(outcomes.values()) <= {"success", "budget_exceeded"}, outcomes   # none timed out ("store_busy")
    assert list(outcomes.values()).count("success") >= 4
    assert waited and waited[0]["status"].startswith("waiting for pull r")
    from zenedge.store import Store

    store = Store(home)
    assert store.check(budget=int(one * 4.5)) == [] and listed == {row["name"] for row in store.names()}
