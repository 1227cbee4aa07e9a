"""A base's resident file (runtime/resident_file.py): the second load reads the int4 copies the
first one made, bit for bit the same model, and a file that does not match is never used."""

import pytest
import torch

from tests.conftest import make_tiny_base
from zenedge.kernels import native
from zenedge.runtime import quantized_load, resident_file
from zenedge.runtime.model import load_resident
from zenedge.runtime.resident_file import ResidentCache

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(native.int4_gemm() is None or native.int8_gemm() is None,
                                reason="the resident file holds the C kernels' copies")


def _logits(resident, ids):
    with torch.inference_mode():
        return resident.model(input_ids=ids).logits


def _no_quantizing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("quantized the source although a valid resident file was there")
    monkeypatch.setattr(quantized_load, "_quantize_from", refuse)


@pytest.mark.parametrize("tied", [True, False], ids=["tied-head", "untied-head"])
def test_the_second_load_reads_the_resident_file_and_gives_the_same_model(tmp_path, monkeypatch, tied):
    base = make_tiny_base(tmp_path / "base", tied=tied)
    cache = ResidentCache(base / "resident", source="digest-1")
    first = load_resident("tiny", base, CPU, torch.float32, "int4", cache)
    assert cache.path("int4").is_file()
    _no_quantizing(monkeypatch)
    second = load_resident("tiny", base, CPU, torch.float32, "int4", cache)
    ids = torch.randint(3, 200, (2, 9))
    assert torch.equal(_logits(first, ids), _logits(second, ids))
    assert second.state.native_steps and type(second.model.lm_head.fast).__name__ == "NativeInt8Weight"
    # the same layout, stacked again: the decode step's q/k/v copy
    attention = second.model.model.layers[0].self_attn
    assert getattr(attention.q_proj.fast, "_stacked", None) is not None


def test_a_resident_file_of_another_source_dtype_or_format_is_rebuilt(tmp_path, monkeypatch):
    base = make_tiny_base(tmp_path / "base")
    old = ResidentCache(base / "resident", source="digest-1")
    load_resident("tiny", base, CPU, torch.float32, "int4", old)
    calls = []
    original = quantized_load._quantize_from
    monkeypatch.setattr(quantized_load, "_quantize_from", lambda *a, **k: calls.append(1) or original(*a, **k))
    new = ResidentCache(base / "resident", source="digest-2")        # the source changed
    load_resident("tiny", base, CPU, torch.float32, "int4", new)
    assert calls == [1]
    load_resident("tiny", base, CPU, torch.bfloat16, "int4", new)    # another dtype
    assert calls == [1, 1]
    load_resident("tiny", base, CPU, torch.bfloat16, "int4", new)    # the file the last load wrote
    assert calls == [1, 1]


def test_a_damaged_resident_file_is_ignored_and_rewritten(tmp_path):
    base = make_tiny_base(tmp_path / "base")
    cache = ResidentCache(base / "resident", source="digest-1")
    reference = load_resident("tiny", base, CPU, torch.float32, "int4", cache)
    path = cache.path("int4")
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])                         # a torn copy
    again = load_resident("tiny", base, CPU, torch.float32, "int4", cache)
    ids = torch.randint(3, 200, (1, 7))
    assert torch.equal(_logits(reference, ids), _logits(again, ids))
    assert path.read_bytes() == whole                                  # made again, the same bytes


def test_a_base_directory_that_cannot_hold_the_file_still_loads(tmp_path):
    """(A read-only store: as root, permissions do not stop a write, so the place is taken by a file.)"""
    base = make_tiny_base(tmp_path / "base")
    (base / "resident").write_text("not a directory")
    cache = ResidentCache(base / "resident", source="digest-1")
    resident = load_resident("tiny", base, CPU, torch.float32, "int4", cache)
    assert resident.weights == "int4" and (base / "resident").read_text() == "not a directory"
    assert not list(base.rglob("*.tmp"))


def test_the_file_is_plain_safetensors_with_the_kernels_layout(tmp_path):
    from safetensors import safe_open

    base = make_tiny_base(tmp_path / "base")
    cache = ResidentCache(base / "resident", source="digest-1")
    resident = load_resident("tiny", base, CPU, torch.float32, "int4", cache)
    with safe_open(cache.path("int4"), framework="pt") as f:
        assert f.metadata()["layout"] == resident_file.LAYOUT
        codes = f.get_tensor("model.layers.1.mlp.down_proj.fast.codes")
        assert "model.embed_tokens.weight" in f.keys() and "lm_head.weight" not in f.keys()   # tied
    assert torch.equal(codes, resident.model.model.layers[1].mlp.down_proj.fast.codes)


def test_the_file_is_read_in_place_stacked_and_settled(tmp_path, monkeypatch):
    """The copies land where `settle` would put them: each q/k/v group one stacked copy whose parts
    are views of its rows, nothing moved after the read."""
    from zenedge.runtime import cpu_weights

    base = make_tiny_base(tmp_path / "base")
    cache = ResidentCache(base / "resident", source="digest-1")
    first = load_resident("tiny", base, CPU, torch.float32, "int4", cache)
    moved = []
    monkeypatch.setattr(cpu_weights, "settled_block", lambda specs, original=cpu_weights.settled_block:
                        moved.append(len(specs)) or original(specs))
    second = load_resident("tiny", base, CPU, torch.float32, "int4", cache)
    assert len(moved) == 2 and moved[1] == 0          # the read's block; settle found nothing to move
    attention = second.model.model.layers[0].self_attn
    parts = [attention.q_proj.fast, attention.k_proj.fast, attention.v_proj.fast]
    whole = cpu_weights.stacked(parts)
    assert whole.codes.data_ptr() == parts[0].codes.data_ptr()
    assert parts[1].codes.data_ptr() == parts[0].codes.data_ptr() + parts[0].codes.numel()
    x = torch.randn(3, parts[0].inputs)
    assert torch.equal(whole.linear(x, None), torch.cat([p.linear(x, None) for p in parts], dim=-1))
    ids = torch.randint(3, 200, (2, 9))
    assert torch.equal(_logits(first, ids), _logits(second, ids))


def test_a_thread_that_cannot_start_reads_in_the_caller(tmp_path, monkeypatch):
    import threading

    base = make_tiny_base(tmp_path / "base")
    cache = ResidentCache(base / "resident", source="digest-1")
    first = load_resident("tiny", base, CPU, torch.float32, "int4", cache)

    def refuse(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", refuse)
    _no_quantizing(monkeypatch)
    second = load_resident("tiny", base, CPU, torch.float32, "int4", cache)
    ids = torch.randint(3, 200, (1, 7))
    assert torch.equal(_logits(first, ids), _logits(second, ids))
