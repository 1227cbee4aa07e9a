"""Every bad adapter is refused with one clear line, a non-zero exit, and nothing left behind."""

import json
import re
import struct

import pytest

from tests.conftest import run_cli, tiny_module_shapes, write_lora_dir
from tests.pool.conftest import set_config
from zenedge import pool
from zenedge.adapters.peft_lora import read_lora_dir
from zenedge.config import load
from zenedge.errors import InvalidAdapter, InvalidInput


def corrupt(path, fn):
    weights = path / "adapter_model.safetensors"
    weights.write_bytes(fn(weights.read_bytes()))
    return path


def raw_safetensors(header: dict, data: bytes) -> bytes:
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + data


def bad_header_claims_huge_sizes(data: bytes) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    key = next(k for k in header if k != "__metadata__")
    header[key]["shape"] = [2**30, 2**30]
    return raw_safetensors(header, data[8 + n:])


def nan_in_first_tensor(data: bytes) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    body = bytearray(data)
    body[8 + n:8 + n + 4] = struct.pack("<f", float("nan"))
    return bytes(body)


CASES = {
    "truncated": lambda d: d[: len(d) // 2],
    "empty file": lambda d: b"",
    "header length beyond file": lambda d: struct.pack("<Q", 10**12) + d[8:],
    "header not json": lambda d: struct.pack("<Q", 5) + b"{{{{{" + d[8:],
    "absurd shape": bad_header_claims_huge_sizes,
    "nan": nan_in_first_tensor,
    "trailing garbage": lambda d: d + b"junk",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_corrupt_weights_are_refused(store, lora_factory, tmp_path, case):
    path = corrupt(lora_factory(), CASES[case])
    with pytest.raises(InvalidAdapter):
        pool.import_lora(store, load(), path, "bad", base="tiny")
    assert store.names() == [] and list(store.blobs.digests()) == []


def test_inf_in_bf16_is_caught(tmp_path, tiny_base_dir):
    import torch
    from safetensors.torch import save_file

    path = write_lora_dir(tmp_path / "a", tiny_module_shapes(tiny_base_dir))
    from safetensors.torch import load_file

    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(path / "adapter_model.safetensors").items()}
    first = sorted(tensors)[0]
    tensors[first][0, 0] = float("inf")
    save_file(tensors, str(path / "adapter_model.safetensors"))
    with pytest.raises(InvalidAdapter, match="NaN or Inf"):
        read_lora_dir(path)


def test_wrong_shapes_for_the_base_are_refused(store, tiny_base_dir, tmp_path):
    shapes = {m: (o * 2, i) for m, (o, i) in tiny_module_shapes(tiny_base_dir).items()}
    path = write_lora_dir(tmp_path / "wide", shapes)
    with pytest.raises(InvalidAdapter, match="made for another model"):
        pool.import_lora(store, load(), path, "wide", base="tiny")


def test_adapter_for_modules_the_base_lacks_is_refused(store, tmp_path):
    shapes = {"model.layers.0.self_attn.q_proj": (64, 64), "transformer.h.0.attn.c_attn": (192, 64)}
    path = write_lora_dir(tmp_path / "gpt2ish", shapes, targets=("q_proj", "c_attn"))
    with pytest.raises(InvalidAdapter, match="does not exist in the base"):
        pool.import_lora(store, load(), path, "other", base="tiny")


@pytest.mark.parametrize("filename", ["adapter_model.bin", "pytorch_model.pt", "x.ckpt"])
def test_pickles_are_refused_outright(lora_factory, filename):
    path = lora_factory()
    (path / filename).write_bytes(b"\x80\x04pickle")
    with pytest.raises(InvalidAdapter, match="pickle"):
        read_lora_dir(path)


@pytest.mark.parametrize("patch,fragment", [
    ({"peft_type": "IA3"}, "only LORA"),
    ({"r": 0}, "r must be"),
    ({"r": 8}, "expected rank 8"),
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"lora_alpha": "big"}, "lora_alpha"),
])
def test_bad_adapter_config_is_refused(lora_factory, patch, fragment):
    path = lora_factory()
    config = json.loads((path / "adapter_config.json").read_text())
    config.update(patch)
    (path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidAdapter, match=fragment):
        read_lora_dir(path)


def test_config_that_is_not_json_is_refused(lora_factory):
    path = lora_factory()
    (path / "adapter_config.json").write_text("{not json")
    with pytest.raises(InvalidAdapter, match="not valid JSON"):
        read_lora_dir(path)


def test_missing_files_are_named(tmp_path, lora_factory):
    with pytest.raises(InvalidAdapter, match="not a directory"):
        read_lora_dir(tmp_path / "nowhere")
    path = lora_factory()
    (path / "adapter_model.safetensors").unlink()
    with pytest.raises(InvalidAdapter, match="no adapter_model.safetensors"):
        read_lora_dir(path)


def test_a_real_peft_adapter_imports(store, tiny_base_dir, tmp_path):
    """What PEFT's own save_pretrained writes is accepted as is."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_base_dir)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    peft_model.save_pretrained(tmp_path / "peft")
    result = pool.import_lora(store, load(), tmp_path / "peft", "real", base="tiny")
    adapter = store.resolve("real")
    assert result.kind == "lora" and adapter["rank"] == 4
    assert len(adapter["target_modules"]) == 2 * 2  # q and v in both layers


def test_cli_import_errors_are_one_line_with_exit_2(store, lora_factory):
    path = corrupt(lora_factory(), CASES["truncated"])
    result = run_cli("import", str(path), "--name", "bad", "--base", "tiny")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_adapters_on_modules_the_runtime_does_not_serve_are_refused(store, tiny_base_dir, tmp_path):
    shapes = {m: s for m, s in tiny_module_shapes(tiny_base_dir).items()}
    shapes["lm_head"] = (256, 64)
    path = write_lora_dir(tmp_path / "head", shapes, targets=("q_proj", "lm_head"))
    with pytest.raises(InvalidAdapter, match="lm_head"):
        pool.import_lora(store, load(), path, "head", base="tiny")


def with_targets(path, targets):
    config = json.loads((path / "adapter_config.json").read_text())
    config["target_modules"] = targets
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("targets,fragment", [
    (["q_proj", "k_proj", "v_proj", "o_proj", "nonexistent_proj"], "'nonexistent_proj' match no module of the base"),
    (["q_proj", "k_proj", "v_proj", "o_proj", "self_attn.qq_proj", "mlp"], "'self_attn.qq_proj', 'mlp' match no"),
    (r".*\.(wq|wk)", "match no module of the base"),
    (["q_proj", "k_proj"], "target_modules does not select"),
    (None, "no target_modules"),
    ([], "no target_modules"),
    (42, "target_modules must be"),
    ("([", "not a valid regular expression"),
])
def test_target_modules_that_do_not_fit_the_base_are_refused(store, lora_factory, targets, fragment):
    """Regression: target_modules naming modules the base lacks were accepted and exported
    unchanged, and PEFT then refused to load the export."""
    path = with_targets(lora_factory(), targets)
    with pytest.raises(InvalidAdapter, match=re.escape(fragment) if "(" not in fragment else fragment):
        pool.import_lora(store, load(), path, "odd", base="tiny")
    assert store.names() == []


@pytest.mark.parametrize("targets", [["q_proj", "k_proj", "v_proj", "o_proj"],
                                     ["self_attn.q_proj", "self_attn.k_proj", "v_proj", "o_proj", "gate_proj"],
                                     r"model\.layers\.\d+\.self_attn\.(q|k|v|o)_proj", "all-linear"])
def test_target_modules_as_peft_matches_them_are_accepted(store, lora_factory, tmp_path, targets):
    """Names match a module whose name ends with them, a string is a full-match regular expression,
    "all-linear" selects every linear layer: what PEFT does, so the export loads there."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from zenedge.pool.export import export

    path = with_targets(lora_factory(), targets)
    pool.import_lora(store, load(), path, "fits", base="tiny")
    export(store, tmp_path / "out", ["fits"])
    base = AutoModelForCausalLM.from_pretrained(store.home / store.base("tiny")["dir"])
    loaded = PeftModel.from_pretrained(base, tmp_path / "out" / "fits")
    assert sum(".lora_A." in n for n, _ in loaded.named_parameters()) >= 8


def test_a_missing_path_is_refused_before_the_default_base_is_set_up(tmp_path, isolated_home):
    from tests.conftest import run_cli

    result = run_cli("import", str(tmp_path / "nowhere"), "--name", "x")
    assert result.returncode == 2 and result.stderr.startswith("error: ") and "no such file" in result.stderr
    assert not any((isolated_home / "bases").iterdir())  # nothing was converted first


@pytest.mark.parametrize("content, message", [("not json\n", "invalid JSON"), ("", "empty"),
                                              ('{"prompt": "x"}\n', "missing key")])
def test_import_refuses_an_unusable_eval_set(store, tmp_path, make_profile, content, message):
    a_dir, _ = make_profile("alpha", 1, with_eval=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    for eval_path in (bad, tmp_path, tmp_path / "missing.jsonl"):
        with pytest.raises(InvalidInput):
            pool.import_lora(store, set_config(tmp_path, ""), a_dir, "alpha", base="tiny", eval_path=eval_path)
    with pytest.raises(InvalidInput, match=message):
        pool.import_lora(store, set_config(tmp_path, ""), a_dir, "alpha", base="tiny", eval_path=bad)
    assert store.names() == []


def test_a_bitdelta_of_a_sharded_base_names_the_identity_the_store_records(isolated_home, cfg, tmp_path):
    """One identity for a base: a .bitdelta compressed without an explicit base digest records the
    digest the store keeps for the same (sharded) checkpoint, so import accepts it."""
    from tests.bitdelta.conftest import fine_tune, save_checkpoint, tiny_model
    from zenedge import bases
    from zenedge.bitdelta.compressor import compress_model
    from zenedge.bitdelta.fileformat import load_bitdelta
    from zenedge.store import Store

    import torch

    base = tiny_model()
    tuned = fine_tune(base)
    with torch.no_grad():  # projections only: the pool serves deltas of the projections
        tuned.model.layers[1].post_attention_layernorm.weight.copy_(base.model.layers[1].post_attention_layernorm.weight)
    base_dir = save_checkpoint(base, tmp_path / "base", shards=2)
    tuned_dir = save_checkpoint(tuned, tmp_path / "tuned", shards=2)
    store = Store(isolated_home)
    row = bases.add_hf_dir(store, base_dir, "sharded")
    report = compress_model(base_dir, tuned_dir, tmp_path / "tuned.bitdelta")
    assert load_bitdelta(report.out_path).base_sha256 == row["weights_sha256"] == bases.weights_sha256(base_dir)
    result = pool.import_bitdelta(store, cfg, report.out_path, "tuned", base="sharded")
    assert result.action == "stored" and store.resolve("tuned")["kind"] == "bitdelta"
