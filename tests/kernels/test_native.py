"""zenedge's C kernels for the CPU (kernels/*.c through kernels/native.py) against torch: RMSNorm
and decode attention here (the int4 product: tests/runtime/test_cpu_weights.py), the layouts they
refuse, the build cache, and the switch that turns them off."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from zenedge.kernels import native

CPU = torch.device("cpu")
needs_native = pytest.mark.skipif(native.library() is None, reason="no native CPU kernels on this machine")


@needs_native
@pytest.mark.parametrize("shape", [(1, 576), (3, 100), (2, 5, 64)])
def test_rms_norm_matches_torch(shape):
    torch.manual_seed(0)
    x, weight = torch.randn(shape) * 3, torch.randn(shape[-1])
    norm = native.rms_norm_fn(weight, 1e-5)
    torch.testing.assert_close(norm(x), F.rms_norm(x, (shape[-1],), weight, 1e-5), rtol=1e-5, atol=1e-6)
    wide = torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]                  # not contiguous: torch's op
    torch.testing.assert_close(norm(wide), F.rms_norm(wide, (shape[-1],), weight, 1e-5))
    assert native.rms_norm_fn(weight.to(torch.bfloat16), 1e-5) is None      # fp32 weights only


def cached(batch, kv_heads, length, dim, capacity=40):
    """Keys, values as the static cache hands them out: views of [B, H_kv, capacity, D] buffers."""
    buffers = torch.randn(2, batch + 1, kv_heads, capacity, dim)
    return buffers[0, :batch, :, :length], buffers[1, :batch, :, :length]


@needs_native
@pytest.mark.parametrize("batch, heads, kv_heads, length, dim", [(1, 9, 3, 1, 64), (1, 9, 3, 37, 64),
                                                                 (3, 4, 4, 20, 32), (2, 8, 2, 33, 16)])
def test_decode_attention_matches_sdpa(batch, heads, kv_heads, length, dim):
    torch.manual_seed(0)
    keys, values = cached(batch, kv_heads, length, dim)
    qkv = torch.randn(batch, heads + kv_heads, dim)
    q = qkv[:, :heads]                                                          # strided rows, as the step slices them
    mask = torch.zeros(batch + 1, 1, 1, 64)[:batch, ..., :length]
    mask[0, ..., : length // 2] = torch.finfo(torch.float32).min               # a left-padded row
    attend = native.decode_attention_fn(heads, kv_heads, dim, dim ** -0.5, torch.float32, CPU)
    got = attend(q, keys, values, mask)
    groups = heads // kv_heads
    want = F.scaled_dot_product_attention(q.reshape(batch, kv_heads, groups, dim), keys, values, attn_mask=mask,
                                          scale=dim ** -0.5).reshape(batch, heads, dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@needs_native
def test_decode_attention_refuses_what_it_does_not_take():
    assert native.decode_attention_fn(8, 2, 24, 0.1, torch.float32, CPU) is None     # D not a multiple of 16
    assert native.decode_attention_fn(8, 3, 64, 0.1, torch.float32, CPU) is None     # heads not grouped evenly
    assert native.decode_attention_fn(8, 2, 64, 0.1, torch.bfloat16, CPU) is None
    assert native.decode_attention_fn(8, 2, 64, 0.1, torch.float32, "cuda") is None  # CPU memory only
    attend = native.decode_attention_fn(4, 2, 16, 0.25, torch.float32, CPU)
    keys, values = cached(1, 2, 5, 16)
    q, mask = torch.randn(1, 4, 16), torch.zeros(1, 1, 1, 5)
    assert attend(q, keys.transpose(2, 3).contiguous().transpose(2, 3), values, mask) is None   # positions not rows
    assert attend(q, keys, values, torch.zeros(1, 1, 1, 6)) is None                             # mask of another length
    assert attend(torch.randn(1, 6, 16), keys, values, mask) is None                           # other head counts
    assert attend(q, *cached(1, 3, 5, 16), mask) is None
    assert attend(q, keys, values, mask.double()) is None
    assert attend(q, keys, values, mask) is not None


@needs_native
def test_the_library_is_built_once_per_source():
    """Named by a hash of the sources and flags: a second process loads the same file."""
    built = sorted(native.paths.kernel_cache().glob("cpu-kernels-*.so"))
    assert built
    code = "from zenedge.kernels import native; print(native.library()._name)"
    name = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert name in map(str, built)


def test_native_kernels_can_be_turned_off():
    code = ("from zenedge.kernels import native; from zenedge.runtime import cpu_weights; import torch;"
            "print(native.library(), type(cpu_weights.fast_copy(torch.randn(64, 64), 'int4')).__name__)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ZENEDGE_NATIVE_KERNELS": "0"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "None" and out[1] in ("Int4Weight", "NoneType")    # torch's int4 kernel, where it has one


def test_a_library_others_can_write_is_not_loaded(tmp_path, monkeypatch):
    """Loading a library runs its code: one in a directory other users can write is refused."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(native.paths, "kernel_cache", lambda: shared)
    if native._unavailable_reason() is not None:
        pytest.skip(native._unavailable_reason())
    with pytest.raises(OSError, match="not private"):
        native._build_and_open()


def test_models_the_kernels_cannot_serve_never_build_them():
    """A bf16 (or CUDA) model's norms and attention ask, and get None without a build or a self-test."""
    code = ("import torch; from zenedge.kernels import native;"
            "assert native.rms_norm_fn(torch.randn(8).bfloat16(), 1e-5) is None;"
            "assert native.decode_attention_fn(4, 2, 64, 0.1, torch.float32, 'cuda') is None;"
            "print(native._loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
