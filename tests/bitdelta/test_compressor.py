"""compress_model on tiny random llamas: contents, metadata, byte counts, reconstruction, errors."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import save_file

from zenedge.bitdelta.compressor import compress_model, is_projection
from zenedge.bitdelta.errors import (BadDtype, BitDeltaFormatError, CheckpointMismatch, InconsistentShapes,
                                     MissingTensor, NonFiniteAlpha, UnknownFormatVersion)
from zenedge.bitdelta.fileformat import load_bitdelta, save_bitdelta
from zenedge.bitdelta.packing import compress, unpack_signs

from .conftest import PROJECTIONS, fine_tune, save_checkpoint, tiny_model


def test_compressed_file_reconstructs_the_sign_code_of_every_projection(checkpoints, tmp_path):
    base, tuned, base_dir, tuned_dir = checkpoints
    seen = []
    report = compress_model(base_dir, tuned_dir, tmp_path / "out.bitdelta",
                            progress=lambda done, total, name: seen.append((done, total)))
    assert report.modules_compressed == 2 * len(PROJECTIONS)
    assert seen[-1][0] == seen[-1][1]
    data = load_bitdelta(report.out_path)
    base_params, tuned_params = dict(base.named_parameters()), dict(tuned.named_parameters())
    for name, (packed, alpha, in_features) in data.modules.items():
        delta = tuned_params[name + ".weight"].detach() - base_params[name + ".weight"].detach()
        ref_packed, ref_alpha = compress(delta)
        assert torch.equal(packed, ref_packed) and torch.allclose(alpha, ref_alpha)
        w_hat = base_params[name + ".weight"] + alpha[:, None] * unpack_signs(packed, in_features)
        err = (w_hat - tuned_params[name + ".weight"]).norm() / delta.norm()
        assert 0.3 < err < 0.9                       # a 1-bit code of Gaussian noise: ~0.6
    assert list(data.extra) == ["model.layers.1.post_attention_layernorm.weight"]
    assert torch.equal(data.extra["model.layers.1.post_attention_layernorm.weight"],
                       tuned.model.layers[1].post_attention_layernorm.weight.detach())
    assert 0.3 < report.mean_relative_error < 0.9


def test_metadata_and_byte_counts_are_honest(checkpoints, tmp_path):
    _, _, base_dir, tuned_dir = checkpoints
    report = compress_model(base_dir, tuned_dir, tmp_path / "out.bitdelta")
    data = load_bitdelta(report.out_path)
    meta = data.metadata
    assert meta["format"] == "zenedge.bitdelta" and meta["format_version"] == "1"
    assert data.base_sha256 == hashlib.sha256((base_dir / "model.safetensors").read_bytes()).hexdigest()
    modules = json.loads(meta["modules"])
    assert {m["name"] for m in modules} == set(data.modules)
    packed_bytes = sum(p.numel() + a.numel() * 4 for p, a, _ in data.modules.values())
    full_bytes = sum(p.shape[0] * n * 4 for p, _, n in data.modules.values())        # fp32 checkpoint
    assert report.bytes_bitdelta == packed_bytes == int(meta["bytes_bitdelta"])
    assert report.bytes_full_delta == full_bytes == int(meta["bytes_full_delta"])
    assert report.ratio == pytest.approx(full_bytes / packed_bytes)
    assert report.file_bytes == report.out_path.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "out.bitdelta", "tuned"]   # no temp files left


def test_sharded_checkpoints_and_given_base_hash(tmp_path):
    base = tiny_model()
    base_dir = save_checkpoint(base, tmp_path / "base", shards=3)
    tuned_dir = save_checkpoint(fine_tune(base), tmp_path / "tuned", shards=2)
    report = compress_model(base_dir, tuned_dir, tmp_path / "o.bitdelta", base_sha256="ab" * 32)
    assert report.modules_compressed == 14
    assert load_bitdelta(report.out_path).base_sha256 == "ab" * 32


def test_unchanged_model_stores_no_extras(tmp_path):
    base = tiny_model()
    base_dir = save_checkpoint(base, tmp_path / "a")
    same_dir = save_checkpoint(base, tmp_path / "b")
    report = compress_model(base_dir, same_dir, tmp_path / "o.bitdelta")
    assert report.extra_tensors == 0 and report.mean_relative_error == 0.0
    assert all((a == 0).all() for _, a, _ in load_bitdelta(report.out_path).modules.values())


def test_shape_mismatch_is_a_checkpoint_mismatch(tmp_path):
    base_dir = save_checkpoint(tiny_model(), tmp_path / "base")
    other = {"model.layers.0.self_attn.q_proj.weight": torch.zeros(32, 64)}
    (tmp_path / "bad").mkdir()
    save_file(other, str(tmp_path / "bad" / "model.safetensors"))
    with pytest.raises(CheckpointMismatch):
        compress_model(base_dir, tmp_path / "bad", tmp_path / "o.bitdelta")
    assert not (tmp_path / "o.bitdelta").exists()


def test_projection_rule():
    assert is_projection("model.layers.3.mlp.down_proj.weight", (64, 128))
    assert not is_projection("model.layers.3.input_layernorm.weight", (64,))
    assert not is_projection("model.embed_tokens.weight", (256, 64))
    assert not is_projection("lm_head.weight", (256, 64))


def _write(path, tensors, meta):
    save_file(tensors, str(path), metadata=meta)
    return path


def _valid(**changes):
    tensors = {"m.packed": torch.zeros(4, 2, dtype=torch.uint8), "m.alpha": torch.ones(4)}
    meta = {"format": "zenedge.bitdelta", "format_version": "1", "base_sha256": "0" * 64,
            "modules": json.dumps([{"name": "m", "in_features": 12, "out_features": 4}]), "extra": "[]"}
    tensors.update(changes.pop("tensors", {}))
    meta.update(changes)
    return tensors, meta


@pytest.mark.parametrize("tensors,meta,error", [
    (*_valid(format_version="7"), UnknownFormatVersion),
    (*_valid(format="something"), BitDeltaFormatError),
    (*_valid(modules="not json"), BitDeltaFormatError),
    (*_valid(tensors={"m.alpha": torch.tensor([1.0, float("nan"), 1.0, 1.0])}), NonFiniteAlpha),
    (*_valid(tensors={"m.alpha": torch.ones(4, dtype=torch.float64)}), BadDtype),
    (*_valid(tensors={"m.packed": torch.zeros(4, 2, dtype=torch.int8)}), BadDtype),
    (*_valid(tensors={"m.packed": torch.zeros(4, 3, dtype=torch.uint8)}), InconsistentShapes),
    (*_valid(tensors={"m.alpha": torch.ones(5)}), InconsistentShapes),
    (*_valid(extra='["missing.weight"]'), MissingTensor),
])
def test_loader_rejects_defects_with_one_line_value_errors(tmp_path, tensors, meta, error):
    path = _write(tmp_path / "f.bitdelta", tensors, meta)
    with pytest.raises(error) as info:
        load_bitdelta(path)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_garbage_file_is_a_format_error(tmp_path):
    (tmp_path / "g.bitdelta").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(BitDeltaFormatError):
        load_bitdelta(tmp_path / "g.bitdelta")


def test_save_round_trip(checkpoints, tmp_path):
    _, _, base_dir, tuned_dir = checkpoints
    data = load_bitdelta(compress_model(base_dir, tuned_dir, tmp_path / "a.bitdelta").out_path)
    again = load_bitdelta(save_bitdelta(tmp_path / "b.bitdelta", data))
    assert again.metadata["base_sha256"] == data.metadata["base_sha256"]
    for name, (packed, alpha, n) in data.modules.items():
        p2, a2, n2 = again.modules[name]
        assert torch.equal(packed, p2) and torch.equal(alpha, a2) and n == n2
    assert all(torch.equal(t, again.extra[k]) for k, t in data.extra.items())
