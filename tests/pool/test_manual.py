"""`zenedge merge` by hand: any method, the pool's gate reported and enforced, every member served."""

import pytest

from tests.pool.conftest import set_config
from zenedge import pool
from zenedge.errors import InvalidInput, MergeRejected
from zenedge.pool import manual_merge


@pytest.mark.parametrize("method", ["ties", "kmerge-linear", "svd-soup", "opcm"])
def test_merge_by_hand_serves_every_member(store, tmp_path, make_profile, method):
    a_dir, a_eval = make_profile("alpha", 1)
    b_dir, b_eval = make_profile("beta", 2, like=a_dir, noise=0.05)
    cfg = set_config(tmp_path, "")
    pool.import_lora(store, cfg, a_dir, "alpha", base="tiny", eval_path=a_eval)
    pool.import_lora(store, cfg, b_dir, "beta", base="tiny", eval_path=b_eval)
    result = manual_merge(store, cfg, ["alpha", "beta"], method, force=True)
    assert set(result["retention"]) == {"alpha", "beta"}
    assert store.resolve("alpha")["id"] == store.resolve("beta")["id"] == result["adapter_id"]
    assert store.usage().adapters == 1 and store.check() == []


def test_merge_by_hand_below_threshold_changes_nothing(store, tmp_path, make_profile):
    a_dir, a_eval = make_profile("alpha", 1)
    b_dir, b_eval = make_profile("beta", 9)
    cfg = set_config(tmp_path, "[pool]\nquality_threshold = 1.0\n")
    pool.import_lora(store, cfg, a_dir, "alpha", base="tiny", eval_path=a_eval)
    pool.import_lora(store, cfg, b_dir, "beta", base="tiny", eval_path=b_eval)
    with pytest.raises(MergeRejected, match="nothing was changed"):
        manual_merge(store, cfg, ["alpha", "beta"], "opcm")
    assert store.usage().adapters == 2 and store.merges() == []


@pytest.mark.parametrize("names, method", [(["alpha"], "opcm"), (["alpha", "alpha"], "ties"),
                                           (["alpha", "beta"], "monosoup")])
def test_merge_by_hand_needs_distinct_adapters(store, tmp_path, make_profile, names, method):
    a_dir, _ = make_profile("alpha", 1, with_eval=False)
    b_dir, _ = make_profile("beta", 2, with_eval=False)
    cfg = set_config(tmp_path, "")
    pool.import_lora(store, cfg, a_dir, "alpha", base="tiny")
    pool.import_lora(store, cfg, b_dir, "beta", base="tiny")
    with pytest.raises(InvalidInput, match="two different adapters|edits one adapter"):
        manual_merge(store, cfg, names, method)
    assert store.usage().adapters == 2 and store.merges() == []
