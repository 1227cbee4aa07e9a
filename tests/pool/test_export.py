"""Exported adapters load in the real libraries and compute what zenedge's runtime computes."""

import json

import torch

from tests.runtime.test_bitdelta_runtime import delta_file, fine_tune_copy  # noqa: F401 (fixture)
from zenedge import pool
from zenedge.pool.export import MANIFEST, export
from zenedge.pool import manual_merge


def runtime_logits(engine, name, input_ids):
    route = engine.router.route(name)
    resident = engine.resident(route.base)
    with torch.inference_mode(), resident.state.using([engine.variant(route)]):
        return resident.model(input_ids=input_ids).logits


def test_lora_and_merged_adapters_round_trip_through_peft(engine, store, cfg, imported, tiny_base_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    imported("solo", seed=1)
    imported("a", seed=2)
    imported("b", seed=3)
    manual_merge(store, cfg, ["a", "b"], "opcm", force=True, engine=engine)
    manifest = export(store, tmp_path / "out")
    assert manifest["aliases"]["b"] == manifest["aliases"]["a"]
    assert json.loads((tmp_path / "out" / MANIFEST).read_text())["format"] == "zenedge-export/1"
    assert "--enable-lora" in manifest["serve"]["vllm"]
    input_ids = torch.randint(3, 99, (2, 9))
    for name in ("solo", "a", "b"):
        folder = tmp_path / "out" / manifest["aliases"][name]
        config = json.loads((folder / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] and config["r"] >= 1
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base_dir), folder).eval()
        with torch.no_grad():
            expected = model(input_ids=input_ids).logits
        assert (runtime_logits(engine, name, input_ids) - expected).abs().max() < 1e-4


def test_bitdelta_exports_as_a_loadable_merged_model(engine, store, cfg, delta_file, tmp_path):  # noqa: F811
    from transformers import AutoModelForCausalLM

    pool.import_bitdelta(store, cfg, delta_file(4), "full", base="tiny")
    manifest = export(store, tmp_path / "out", ["full"])
    assert manifest["adapters"][0]["format"] == "hf-merged"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "full").eval()
    input_ids = torch.randint(3, 99, (1, 8))
    with torch.no_grad():
        expected = model(input_ids=input_ids).logits
    assert (runtime_logits(engine, "full", input_ids) - expected).abs().max() < 1e-4


def test_bitdelta_as_lora_reports_its_error(engine, store, cfg, delta_file, tmp_path):  # noqa: F811
    pool.import_bitdelta(store, cfg, delta_file(5), "full", base="tiny")
    low = export(store, tmp_path / "r4", ["full"], bitdelta_as="lora", rank=4)["adapters"][0]
    high = export(store, tmp_path / "r64", ["full"], bitdelta_as="lora", rank=64)["adapters"][0]
    assert 0 <= high["relative_error"] < low["relative_error"] < 1
    assert high["relative_error"] < 1e-5  # rank 64 ≥ every tiny dimension: exact


def test_format_hf_merged_folds_every_profile_into_a_full_model(engine, store, cfg, imported, delta_file,  # noqa: F811
                                                                tmp_path):
    from transformers import AutoModelForCausalLM

    imported("solo", seed=6)
    pool.import_bitdelta(store, cfg, delta_file(7), "full", base="tiny")
    manifest = export(store, tmp_path / "out", format="hf-merged")
    assert {e["format"] for e in manifest["adapters"]} == {"hf-merged"}
    assert "vllm" not in manifest["serve"]  # nothing left for --enable-lora
    input_ids = torch.randint(3, 99, (2, 7))
    for name in ("solo", "full"):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / manifest["aliases"][name]).eval()
        with torch.no_grad():
            expected = model(input_ids=input_ids).logits
        assert (runtime_logits(engine, name, input_ids) - expected).abs().max() < 1e-4
