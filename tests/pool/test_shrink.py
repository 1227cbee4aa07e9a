"""Compress before merging (pool/shrink.py), end to end on the tiny model: float32 adapters are
stored as bf16, and under byte pressure the least requested adapters are re-stored smaller, each
through the quality gate, before anything is merged or evicted."""

import pytest

from tests.pool.conftest import set_config
from zenedge import pool
from zenedge.adapters.lora_tensors import stored_format
from zenedge.pool.maintain import maintain
from zenedge.runtime.engine import Engine, Prompt
from zenedge.runtime.generate import SamplingParams


def stored(store, name):
    row = store.resolve(name)
    return stored_format(store.blob_path(row["sha256"])), row


def shrinking(tmp_path, text=""):
    return set_config(tmp_path, "[pool]\n" + text, as_given=False)


def alpha_stored_then_beta(store, tmp_path, make_profile, *, similar: bool):
    """alpha imported (as bf16) with room to spare; beta made (a near-copy of alpha, or unrelated)."""
    a_dir, a_eval = make_profile("alpha", 1)
    b_dir, b_eval = make_profile("beta", 2, like=a_dir, noise=0.005) if similar else make_profile("beta", 7)
    pool.import_lora(store, shrinking(tmp_path), a_dir, "alpha", base="tiny", eval_path=a_eval)
    return store.resolve("alpha"), b_dir, b_eval


def test_float32_adapters_are_stored_as_bf16_unless_asked_to_keep_them(store, tmp_path, make_profile):
    a_dir, a_eval = make_profile("alpha", 1)
    size = (a_dir / "adapter_model.safetensors").stat().st_size
    result = pool.import_lora(store, shrinking(tmp_path), a_dir, "alpha", base="tiny", eval_path=a_eval)
    assert stored(store, "alpha")[0] == "bf16" and result.bytes < 0.6 * size
    assert result.compressed == []   # not a compression step: every import is stored this way
    given = set_config(tmp_path, '[pool]\nstore_dtype = "given"\n', as_given=False)
    pool.import_lora(store, given, a_dir, "alpha-as-given", base="tiny")
    assert stored(store, "alpha-as-given")[0] == "fp32"


def test_under_pressure_adapters_are_stored_smaller_before_anything_is_merged(store, tmp_path, make_profile):
    profiles = [make_profile(name, seed) for name, seed in (("alpha", 1), ("beta", 7), ("gamma", 11))]
    roomy = shrinking(tmp_path)
    pool.import_lora(store, roomy, profiles[0][0], "alpha", base="tiny", eval_path=profiles[0][1])
    one = store.resolve("alpha")["bytes"]
    store.record_requests(store.resolve("alpha")["id"], 5)   # alpha is the requested one: beta goes first
    pool.import_lora(store, roomy, profiles[1][0], "beta", base="tiny", eval_path=profiles[1][1])
    evals = store.used_bytes() - store.resolve("alpha")["bytes"] - store.resolve("beta")["bytes"]
    # Room for two bf16 adapters and a half: the third fits once beta (then alpha) is int8.
    cfg = shrinking(tmp_path, f'budget = "{int(one * 2.6) + evals + 800}B"\ncompress_threshold = 0.5\n')
    events = []
    result = pool.import_lora(store, cfg, profiles[2][0], "gamma", base="tiny", eval_path=profiles[2][1],
                              progress=events.append)
    assert result.action == "stored" and store.merges() == []
    kept = [step for step in result.compressed if step.kept]
    assert kept and kept[0].names == ["beta"] and kept[0].compressed_to == "int8"
    assert all(step.stored_as == "bf16" for step in kept) and sum(s.freed_bytes for s in kept) > 0
    assert any(e.get("phase") == "compress" and e["status"].startswith("compressing beta: int8, keeps") for e in events)
    assert "compress" in result.profile["by_phase"]
    format_of_beta, beta = stored(store, "beta")
    assert format_of_beta == "int8" and beta["state"]["compressed"]["to"] == "int8"
    assert beta["kind"] == "lora" and store.name("beta")["quality"]["per_example"]   # anchors stay with it
    assert {row["name"]: row["compressed_to"] for row in store.names()}["beta"] == "int8"   # what `list` shows
    assert store.resolve("alpha")["request_count"] == 5   # in whichever form it is now
    assert store.used_bytes() <= cfg.budget and store.check(budget=cfg.budget) == []
    # The smaller adapter serves its profile.
    engine = Engine(store, cfg)
    assert engine.complete("beta", Prompt(messages=[{"role": "user", "content": "hi"}]),
                           SamplingParams(max_tokens=4)).model == "beta"


def test_a_re_stored_adapter_keeps_its_request_history(store, tmp_path, make_profile):
    profiles = [make_profile(name, seed) for name, seed in (("alpha", 1), ("beta", 7))]
    roomy = shrinking(tmp_path)
    pool.import_lora(store, roomy, profiles[0][0], "alpha", base="tiny", eval_path=profiles[0][1])
    before = store.resolve("alpha")
    store.record_requests(before["id"], 3)
    before = store.resolve("alpha")
    one = before["bytes"]
    cfg = shrinking(tmp_path, f'budget = "{store.used_bytes() + one // 2}B"\ncompress_threshold = 0.3\n')
    report = pool.set_budget(store, cfg, f"{store.used_bytes() - one // 8}B")   # int8 frees that
    assert report.evict == [] and [s.names for s in report.compressed if s.kept] == [["alpha"]], report.compressed
    after = store.resolve("alpha")
    assert after["id"] != before["id"] and after["request_count"] == 3
    assert after["created_at"] == before["created_at"] and after["request_rate"] == before["request_rate"]
    assert [e["kind"] for e in store.events(limit=5)].count("compress") == 1


def test_a_step_the_gate_refuses_changes_nothing_and_merging_or_eviction_follows(store, tmp_path, make_profile):
    alpha, b_dir, b_eval = alpha_stored_then_beta(store, tmp_path, make_profile, similar=False)
    strict = shrinking(tmp_path, f'budget = "{store.used_bytes() + alpha["bytes"] // 2}B"\n'
                                 'compress_threshold = 1.0\nquality_threshold = 0.99\non_no_merge = "evict"\n')
    result = pool.import_lora(store, strict, b_dir, "beta", base="tiny", eval_path=b_eval)
    refused = [s for s in result.compressed if not s.kept]
    assert refused and all(min(s.retention.values()) < 1.0 for s in refused)
    assert result.action == "evicted" and result.evicted == ["alpha"]


def test_nothing_is_compressed_when_it_could_not_free_enough(store, tmp_path, make_profile):
    alpha, b_dir, b_eval = alpha_stored_then_beta(store, tmp_path, make_profile, similar=True)
    one = alpha["bytes"]
    # Room for about one and a quarter adapters: only a merge makes room.
    cfg = shrinking(tmp_path, f'budget = "{store.used_bytes() + one // 4}B"\nquality_threshold = 0.5\n')
    events = []
    result = pool.import_lora(store, cfg, b_dir, "beta", base="tiny", eval_path=b_eval, progress=events.append)
    assert result.compressed == [] and result.action == "merged"
    assert any("merging instead" in e["status"] for e in events if e.get("phase") == "compress")


def test_with_compression_off_the_pool_merges_as_before(store, tmp_path, make_profile):
    alpha, b_dir, b_eval = alpha_stored_then_beta(store, tmp_path, make_profile, similar=True)
    one = alpha["bytes"]
    cfg = shrinking(tmp_path, f'budget = "{store.used_bytes() + one // 2}B"\nquality_threshold = 0.5\n'
                              'compress_to = "off"\n')
    result = pool.import_lora(store, cfg, b_dir, "beta", base="tiny", eval_path=b_eval)
    assert result.compressed == [] and result.action == "merged"


def test_the_newcomer_itself_is_stored_smaller_when_nothing_else_can_be(store, tmp_path, make_profile):
    alpha, b_dir, b_eval = alpha_stored_then_beta(store, tmp_path, make_profile, similar=False)
    store.set_pinned("alpha", True)   # alpha may not change: only beta can be smaller
    room = store.used_bytes() + b_eval.stat().st_size + alpha["bytes"] - 1000   # beta fits as int8, not as bf16
    cfg = shrinking(tmp_path, f'budget = "{room}B"\n'
                              'compress_threshold = 0.3\ncompress_to = "int8"\n')
    result = pool.import_lora(store, cfg, b_dir, "beta", base="tiny", eval_path=b_eval)
    assert result.action == "stored" and [s.names for s in result.compressed] == [["beta"]]
    assert stored(store, "beta")[0] == "int8" and stored(store, "alpha")[0] == "bf16"
    assert store.name("beta")["quality"]["per_example"]   # measured on its own adapter, before storing it smaller


def test_maintenance_compresses_before_it_merges(store, tmp_path, make_profile):
    alpha, b_dir, b_eval = alpha_stored_then_beta(store, tmp_path, make_profile, similar=True)
    pool.import_lora(store, shrinking(tmp_path), b_dir, "beta", base="tiny", eval_path=b_eval)
    one = alpha["bytes"]
    tight = shrinking(tmp_path, f'budget = "{store.used_bytes() - one // 8}B"\ncompress_threshold = 0.3\n')
    report = maintain(store, tight)
    assert report["merged"] == [] and report["evicted"] == [] and report["problems"] == []
    assert [s for s in report["compressed"] if s["kept"]]
    assert store.resolve("alpha")["id"] != store.resolve("beta")["id"]


@pytest.mark.parametrize("storage", ["int8", "int4"])
def test_export_writes_compressed_adapters_as_bf16_peft_files(store, tmp_path, make_profile, storage):
    from safetensors import safe_open

    from zenedge.pool.export import export

    a_dir, a_eval = make_profile("alpha", 1)
    pool.import_lora(store, shrinking(tmp_path), a_dir, "alpha", base="tiny", eval_path=a_eval)
    cfg = shrinking(tmp_path, f'compress_threshold = 0.0\ncompress_to = "{storage}"\n')
    fraction = 8 if storage == "int8" else 3   # what int8 frees, and what only int4 frees (small files: headers weigh)
    pool.set_budget(store, cfg, f"{store.used_bytes() - store.resolve('alpha')['bytes'] // fraction}B")
    assert stored(store, "alpha")[0] == storage
    export(store, tmp_path / "out")
    with safe_open(str(tmp_path / "out" / "alpha" / "adapter_model.safetensors"), framework="pt") as handle:
        assert {handle.get_tensor(k).dtype for k in handle.keys()} == {__import__("torch").bfloat16}
        assert "zenedge.storage" not in (handle.metadata() or {})
