"""A full fine-tune → a 1-bit delta admitted into the pool (zenedge.pool.compress)."""

from tests.runtime.test_bitdelta_runtime import fine_tune_copy
from zenedge.bitdelta import load_bitdelta
from zenedge.pool import compress_finetune


def test_a_fine_tune_is_compressed_stored_and_kept_where_asked(store, cfg, tiny_base_dir, tmp_path):
    finetuned = fine_tune_copy(tiny_base_dir, tmp_path / "ft", seed=3)
    said = []
    summary = compress_finetune(store, cfg, finetuned, "full", base="tiny", output=tmp_path / "copy.bitdelta",
                                progress=said.append)
    row = store.resolve("full")
    assert summary["kind"] == row["kind"] == "bitdelta" and summary["action"] == "stored"
    assert summary["bytes_bits"] < summary["bytes_full"] and summary["modules"] == len(row["target_modules"])
    kept = load_bitdelta(tmp_path / "copy.bitdelta").modules
    assert kept.keys() == load_bitdelta(store.blob_path(row["sha256"])).modules.keys()
    assert said and said[-1].startswith("compressing 100%")
    assert store.check(budget=cfg.budget) == []
