"""1-bit deltas under pressure: similarity from packed bits, streamed dense OPCM, the gate."""

import json
import math

import pytest
import torch

from tests.runtime.test_bitdelta_runtime import fine_tune_copy
from zenedge import config, policy
from zenedge.bitdelta import compress, compress_model, decompress, load_bitdelta
from zenedge.bitdelta.fileformat import BitDeltaFile, save_bitdelta
from zenedge.delta_merge import delta_cosine, delta_norm, merge_bitdelta_files
from zenedge.merge.opcm import opcm_init, opcm_step


def random_delta(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    return {name: compress(torch.randn(o, i, generator=g)) + (i,) for name, (o, i) in shapes.items()}


SHAPES = {"m.a": (6, 13), "m.b": (9, 8)}


def dense(modules):
    return {name: decompress(p, a, i).double() for name, (p, a, i) in modules.items()}


def test_bit_cosine_equals_dense_cosine():
    a, b = random_delta(SHAPES, 1), random_delta(SHAPES, 2)
    da, db = dense(a), dense(b)
    expected = sum(float((da[m] * db[m]).sum() / (da[m].norm() * db[m].norm())) for m in SHAPES) / len(SHAPES)
    assert delta_cosine(a, b) == pytest.approx(expected, abs=1e-9)
    assert delta_cosine(a, a) == pytest.approx(1.0)
    assert delta_norm(a) == pytest.approx(math.sqrt(sum(float(t.square().sum()) for t in da.values())))


def test_streamed_merge_equals_dense_opcm_then_binarised(tmp_path):
    a, b = random_delta(SHAPES, 3), random_delta(SHAPES, 4)
    for name, modules in (("a", a), ("b", b)):
        save_bitdelta(tmp_path / f"{name}.bitdelta", BitDeltaFile(modules=modules, metadata={"base_sha256": "x"}))
    state = merge_bitdelta_files(tmp_path / "a.bitdelta", {}, tmp_path / "b.bitdelta", tmp_path / "m.bitdelta")
    reference = opcm_step(opcm_init(dense(a)), dense(b), 0.5)
    assert state["lam"] == pytest.approx(reference.lam, rel=1e-6)
    merged = load_bitdelta(tmp_path / "m.bitdelta").modules
    for name, expected in reference.merged.items():
        packed, alpha = compress(expected.float())
        assert torch.equal(merged[name][0], packed)
        assert torch.allclose(merged[name][1], alpha, rtol=1e-5)


def test_similar_deltas_are_merged_under_pressure(store, tmp_path, tiny_base_dir):
    base_sha = store.base("tiny")["sha256"]
    ft_a = fine_tune_copy(tiny_base_dir, tmp_path / "ft-a", seed=1)
    paths = {}
    for name, seed in (("first", 1), ("second", 1)):
        ft = ft_a if name == "first" else tmp_path / "ft-b"
        if name == "second":  # the same fine-tune direction, a little more trained
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(ft_a)
            with torch.no_grad():
                for pname, p in model.named_parameters():
                    if p.ndim == 2 and "layers." in pname:
                        p.add_(0.002 * torch.randn_like(p))
            model.save_pretrained(ft)
        paths[name] = tmp_path / f"{name}.bitdelta"
        compress_model(tiny_base_dir, ft, paths[name], base_sha256=base_sha)
    size = paths["first"].stat().st_size
    cfg_path = tmp_path / "config" / "config.toml"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(f'[pool]\nbudget = "{int(size * 1.5)}B"\nquality_threshold = 0.5\n'
                        '[runtime]\ndevice = "cpu"\ndtype = "float32"\nweights = "full"\n')
    cfg = config.load(cfg_path)
    policy.import_bitdelta(store, cfg, paths["first"], "first", base="tiny")
    result = policy.import_bitdelta(store, cfg, paths["second"], "second", base="tiny")
    assert result["action"] == "merged" and result["kind"] == "bitdelta"
    merged = store.resolve("first")
    assert merged["id"] == store.resolve("second")["id"] and len(merged["state"]["norms"]) == 2
    assert store.check(budget=cfg.budget) == []
