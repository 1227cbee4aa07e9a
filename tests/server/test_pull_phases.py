"""A pull that has to make room, through the daemon: the pool's phases reach the client as NDJSON
lines (each also a valid Ollama progress line), and the last line carries the time profile."""

import json

from zenedge.api import wire


def test_a_pull_under_pressure_streams_the_pool_phases(fresh_daemon, registry):
    # Four profiles already fill the four slots: `writer` must be merged into one or evict one.
    daemon = fresh_daemon(config={"registry": {"urls": [registry]}, "pool": {"max_adapters": 4}})
    with daemon.uds() as http:
        with http.stream("POST", "/api/pull", json={"name": "writer"}) as response:
            assert response.status_code == 200
            lines = [json.loads(line) for line in response.iter_lines() if line]
    phases = [line for line in lines if line.get("phase")]
    kinds = [line["phase"] for line in phases]
    if kinds[0] == "load":  # the daemon had not loaded its base yet: the pull's gate loaded it, once
        kinds = kinds[1:]
    assert kinds[:2] == ["rank", "fold"] and "gate" in kinds and kinds[-1] in ("commit", "evict")
    assert all(line["status"] for line in phases)
    assert all(wire.PullProgress.model_validate(line).status for line in lines)
    final = lines[-1]
    assert final["status"] == "success" and final["policy"] in ("merged", "evicted")
    profile = final["profile"]
    assert [p["phase"] for p in profile["phases"] if p["phase"] != "load"][:2] == ["rank", "fold"]
    assert profile["by_phase"]["gate"] > 0
    assert sum(profile["by_phase"].values()) <= profile["total_seconds"] + 0.001 * len(profile["phases"])
    with daemon.uds() as http:
        names = {m["name"] for m in http.get("/api/list").json()["models"]}
    assert "writer" in names and len(names) >= 4


def test_the_cli_pulls_through_a_running_daemon(fresh_daemon, registry):
    """`zenedge pull` with a daemon up: the daemon's resident base gates the merge (no `load` phase:
    no second copy of the base in the CLI process), and the CLI prints the same result and phases."""
    from tests.conftest import run_cli

    from tests.server.harness import chat_body

    daemon = fresh_daemon(config={"registry": {"urls": [registry]}, "pool": {"max_adapters": 4}})
    with daemon.uds() as http:  # the daemon has its base loaded once it has served a request
        assert http.post("/v1/chat/completions", json=chat_body("p0", "hi", max_tokens=2)).status_code == 200
    result = json.loads(run_cli("pull", "writer", "--json", env=daemon.env(), check=True).stdout)
    assert result["name"] == "writer" and result["policy"] in ("merged", "evicted")
    phases = [p["phase"] for p in result["profile"]["phases"]]
    assert phases[:2] == ["rank", "fold"] and "load" not in phases
    printed = run_cli("pull", "writer", env=daemon.env(), check=True).stdout
    assert printed.splitlines()[-1].startswith("pulled writer 1.0.0") and "(already up to date)" in printed
    with daemon.uds() as http:
        assert "writer" in {m["name"] for m in http.get("/api/list").json()["models"]}


def test_a_cli_pull_through_the_daemon_fails_as_a_local_one_does(fresh_daemon, registry):
    from tests.conftest import run_cli

    daemon = fresh_daemon(config={"registry": {"urls": [registry]}})
    remote = run_cli("pull", "no-such-profile", env=daemon.env())
    assert remote.returncode == 1 and remote.stderr.strip().startswith("error:")  # profile_not_found, as locally
    assert len(remote.stderr.strip().splitlines()) == 1 and "no-such-profile" in remote.stderr
