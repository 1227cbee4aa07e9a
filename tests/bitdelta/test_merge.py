"""Merging 1-bit deltas (zenedge.bitdelta.merge): similarity from packed bits, streamed dense OPCM.
The pool merging deltas under pressure is tests/pool/test_merger.py."""

import math

import pytest
import torch

from zenedge.bitdelta import compress, decompress, load_bitdelta
from zenedge.bitdelta.fileformat import BitDeltaFile, save_bitdelta
from zenedge.bitdelta.merge import delta_cosine, delta_norm, merge_bitdelta_files
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
