"""`zenedge bench storage` on tiny profiles: a row per profile with every format (numbers are
not asserted, only what they must satisfy)."""

import json

from tests.conftest import tiny_module_shapes, write_lora_dir
from zenedge.bench.merge import Scorer, load_profiles
from zenedge.bench.storage import _profile_row, table
from zenedge.runtime.engine import Engine


def test_each_profile_is_scored_as_shipped_and_in_every_format(store, tmp_path, tiny_base_dir):
    from zenedge import config

    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text('[runtime]\ndevice = "cpu"\ndtype = "float32"\nweights = "full"\n')
    resident = Engine(store, config.load(cfg_path)).resident("tiny")
    root = tmp_path / "registry"
    for i, (name, metric) in enumerate([("a", "loss"), ("b", "exact_match")]):
        write_lora_dir(root / name / "adapter", tiny_module_shapes(tiny_base_dir), seed=i, scale=0.2)
        (root / name / "eval.jsonl").write_text("".join(json.dumps({"prompt": f"p{j}", "answer": "ab"}) + "\n"
                                                        for j in range(6)))
        (root / name / "recipe.json").write_text(json.dumps({"name": name, "metric": metric}))
    scorer = Scorer(resident, 6)
    rows = [_profile_row(p, scorer, resident, ("int8", "int4")) for p in load_profiles(root, 6)]
    assert [r["name"] for r in rows] == ["a", "b"] and rows[0]["stored_as"] == "fp32"
    for row in rows:
        assert set(row["formats"]) == {"int8", "int4"}
        assert row["bytes"]["as shipped"] > row["bytes"]["int8"] > row["bytes"]["int4"]
    assert "accuracy_ratio" in rows[1]["formats"]["int4"] and "accuracy_ratio" not in rows[0]["formats"]["int4"]
    text = table({"formats": ["int8", "int4"], "rows": rows})
    assert "| a | loss |" in text and "int4: loss retention min" in text
