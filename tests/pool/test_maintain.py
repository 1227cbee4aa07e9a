"""`pool maintain` after a config edit: merge first (the merger's loop), then evict; corrupt blobs go."""

from tests.pool.conftest import set_config
from zenedge import pool
from zenedge.pool.maintain import maintain


def test_maintain_merges_before_evicting_after_a_budget_edit(store, tmp_path, make_profile):
    a_dir, a_eval = make_profile("alpha", 1)
    b_dir, b_eval = make_profile("beta", 2, like=a_dir, noise=0.02)
    roomy = set_config(tmp_path, '[pool]\nquality_threshold = 0.5\n')
    pool.import_lora(store, roomy, a_dir, "alpha", base="tiny", eval_path=a_eval)
    pool.import_lora(store, roomy, b_dir, "beta", base="tiny", eval_path=b_eval)
    size = (a_dir / "adapter_model.safetensors").stat().st_size
    tight = set_config(tmp_path, f'[pool]\nbudget = "{int(size * 1.6) + 2000}B"\nquality_threshold = 0.5\n')
    report = maintain(store, tight)
    assert len(report["merged"]) == 1 and report["evicted"] == [] and report["problems"] == []
    assert store.resolve("alpha")["id"] == store.resolve("beta")["id"]


def test_maintain_removes_adapters_whose_blob_is_corrupt(store, tmp_path, make_profile):
    a_dir, _ = make_profile("alpha", 1, with_eval=False)
    cfg = set_config(tmp_path, "")
    result = pool.import_lora(store, cfg, a_dir, "alpha", base="tiny")
    path = store.blob_path(result.adapter_id)
    data = path.read_bytes()
    path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    report = maintain(store, cfg)
    assert report["removed_corrupt"] == ["alpha"] and store.names() == [] and report["problems"] == []
