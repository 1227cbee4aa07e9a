"""Anchors a registry publishes (each profile's base and own losses per eval example): measured
once by `registry build --anchors`, carried in the manifest, re-checked on a few examples by the
pull that needs them, and re-measured when they do not match."""

import json
import math

import pytest

from tests.pool.conftest import set_config
from tests.registry.test_pull import edit_manifest, nothing_left_behind
from zenedge.errors import RegistryError
from zenedge.pool.gate import VERIFY_EXAMPLES
from zenedge.pool.publish import measure_registry_anchors
from zenedge.registry.builder import build_registry
from zenedge.pool.pull import pull


def published(store, tmp_path, registry_dir):
    cfg = set_config(tmp_path, "")
    assert measure_registry_anchors(store, cfg, registry_dir) == ["coder", "writer", "writer-copy"]
    build_registry(registry_dir)
    return cfg


def pressure_cfg(tmp_path, registry_dir):
    sizes = {name: (registry_dir / name / "adapter" / "adapter_model.safetensors").stat().st_size
             for name in ("coder", "writer")}
    return set_config(tmp_path, f'[registry]\nurls = ["file://{registry_dir}"]\n'
                                f'[pool]\nbudget = "{sizes["coder"] + sizes["writer"] - 1}B"\n')


def anchor_events(events):
    return [e for e in events if e.get("phase") == "anchors"]


def test_published_anchors_ride_in_the_manifest_and_a_pull_only_checks_them(store, tmp_path, registry_dir):
    published(store, tmp_path, registry_dir)
    manifest = json.loads((registry_dir / "writer" / "manifest.json").read_text())
    anchors = manifest["eval"]["anchors"]
    assert len(anchors["base"]) == len(anchors["own_hits"]) > VERIFY_EXAMPLES
    assert all(math.isfinite(v) and v >= 0 for v in anchors["base"] + anchors["own"])
    cfg = pressure_cfg(tmp_path, registry_dir)
    pull(store, cfg, "coder")
    assert store.name("coder")["quality"]["claimed"]
    events = []
    result = pull(store, cfg, "writer", progress=events.append)
    assert result.admitted.action in ("merged", "evicted")
    measured = anchor_events(events)
    # Both members' claims were checked on VERIFY_EXAMPLES examples each, once, in one batch however
    # many candidates the pull tried; nothing was measured whole.
    assert measured and all(e["status"].startswith("checking the registry's measurements") for e in measured)
    rows = [p["rows"] for p in result.admitted.profile["phases"] if p["phase"] == "anchors"]
    assert rows == [2 * 2 * VERIFY_EXAMPLES]
    for row in store.names():  # checked anchors are stored as this pool's own from now on
        quality = store.name(row["name"])["quality"]
        assert quality["per_example"]["own"] and not quality.get("claimed"), row["name"]


def test_anchors_that_do_not_match_this_base_are_measured_again(store, tmp_path, registry_dir):
    published(store, tmp_path, registry_dir)
    edit_manifest(registry_dir, "writer", lambda m: m["eval"]["anchors"].update(
        own=[v + 5.0 for v in m["eval"]["anchors"]["own"]]))  # a registry claiming another adapter's numbers
    cfg = pressure_cfg(tmp_path, registry_dir)
    pull(store, cfg, "coder")
    events = []
    pull(store, cfg, "writer", progress=events.append)
    statuses = [e["status"] for e in anchor_events(events)]
    assert any("do not match this base" in s for s in statuses)
    assert any(s.startswith("measuring") and "writer" in s for s in statuses)


@pytest.mark.parametrize("mutation,fragment", [
    (lambda a: a.update(base=[float("nan")] * len(a["base"])), "non-negative numbers"),
    (lambda a: a.update(own=[-1.0] * len(a["own"])), "non-negative numbers"),
    (lambda a: a.update(own_hits=[0.5] * len(a["own_hits"])), "whole numbers"),
    (lambda a: a.update(base=a["base"][:-1]), "differ in length"),
    (lambda a: a.update(order="../../etc"), "16 hex digits"),
    (lambda a: a.update(base=[0.0] * 100_000), "1 to 256"),
])
def test_malformed_anchors_are_refused_before_anything_is_fetched(store, tmp_path, registry_dir, mutation, fragment):
    cfg = published(store, tmp_path, registry_dir)
    edit_manifest(registry_dir, "writer", lambda m: mutation(m["eval"]["anchors"]))
    cfg = set_config(tmp_path, f'[registry]\nurls = ["file://{registry_dir}"]\n')
    with pytest.raises(RegistryError, match=fragment):
        pull(store, cfg, "writer")
    nothing_left_behind(store)


def test_anchors_of_an_older_eval_set_are_left_out_of_the_manifest(store, tmp_path, registry_dir):
    published(store, tmp_path, registry_dir)
    with (registry_dir / "writer" / "eval.jsonl").open("a") as handle:
        handle.write(json.dumps({"prompt": "one more", "answer": "example"}) + "\n")
    build_registry(registry_dir)
    assert "anchors" not in json.loads((registry_dir / "writer" / "manifest.json").read_text())["eval"]
    assert "anchors" in json.loads((registry_dir / "coder" / "manifest.json").read_text())["eval"]


def test_a_claim_is_checked_once_per_adapter_and_never_taken_for_another(store, tmp_path, registry_dir):
    """The check is remembered per resident model (a daemon's later pulls skip it), keyed by the
    adapter's content: another adapter carrying the same claimed numbers is checked again."""
    from zenedge.adapters.lora_tensors import read_lora_factors
    from zenedge.pool.gate import Member, QualityGate, claimed_quality
    from zenedge.pool.phases import Phases
    from zenedge.runtime.engine import Engine
    from zenedge.runtime.variants import lora_variant

    cfg = published(store, tmp_path, registry_dir)
    resident = Engine(store, cfg).resident("tiny")
    manifest = json.loads((registry_dir / "writer" / "manifest.json").read_text())
    quality = claimed_quality(manifest["eval"]["anchors"])

    def member(adapter_of: str, key: str) -> Member:
        adapter = registry_dir / adapter_of / "adapter"
        factors = read_lora_factors(adapter / "adapter_model.safetensors",
                                    json.loads((adapter / "adapter_config.json").read_text()))
        return Member("writer", registry_dir / "writer" / "eval.jsonl", quality,
                      lora_variant(key, factors, resident), original=True)

    def checks(members) -> list[int]:
        phases = Phases()
        QualityGate(resident)._check_claims(members, phases)  # a new gate each time, as each pull makes one
        return [p["rows"] for p in phases.profile()["phases"] if p["phase"] == "anchors"]

    assert checks([member("writer", "incoming-aaaa")]) == [2 * VERIFY_EXAMPLES]
    assert checks([member("writer", "incoming-aaaa")]) == []                     # remembered
    assert checks([member("coder", "incoming-bbbb")]) == [2 * VERIFY_EXAMPLES]   # another adapter: checked
