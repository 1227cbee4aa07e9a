"""zenedge's C kernels for the CPU (kernels/native/*.c, built and loaded by zenedge.kernels.native)
against torch: RMSNorm, decode attention, the LoRA product and the 1-bit sign product here (the int4 product:
tests/runtime/test_cpu_weights.py), a row's result the same alone as among other rows, the layouts
they refuse, the build cache, and the switch that turns them off."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from zenedge.bitdelta.packing import pack_signs
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
    lengths = torch.tensor([length] + [max(1, length // (i + 2)) for i in range(batch - 1)])   # rows of their own lengths
    attend = native.decode_attention_fn(heads, kv_heads, dim, dim ** -0.5, torch.float32, CPU)
    got = attend(q, keys, values, lengths)
    groups = heads // kv_heads
    for b in range(batch):
        n = int(lengths[b])
        want = F.scaled_dot_product_attention(q[b:b + 1].reshape(1, kv_heads, groups, dim), keys[b:b + 1, :, :n],
                                              values[b:b + 1, :, :n], scale=dim ** -0.5).reshape(heads, dim)
        torch.testing.assert_close(got[b], want, rtol=1e-5, atol=1e-6)


@needs_native
def test_decode_attention_gives_a_row_the_same_result_among_any_rows():
    """Each row over its own length: alone, or beside longer rows, the same bits."""
    torch.manual_seed(0)
    keys, values = cached(4, 3, 40, 64)
    q = torch.randn(4, 9, 64)
    lengths = torch.tensor([17, 40, 3, 29])
    attend = native.decode_attention_fn(9, 3, 64, 0.125, torch.float32, CPU)
    together = attend(q, keys, values, lengths)
    for b in range(4):
        n = int(lengths[b])
        alone = attend(q[b:b + 1], keys[b:b + 1, :, :n], values[b:b + 1, :, :n], lengths[b:b + 1])
        assert torch.equal(alone[0], together[b])


@needs_native
def test_decode_attention_refuses_what_it_does_not_take():
    assert native.decode_attention_fn(8, 2, 24, 0.1, torch.float32, CPU) is None     # D not a multiple of 16
    assert native.decode_attention_fn(8, 3, 64, 0.1, torch.float32, CPU) is None     # heads not grouped evenly
    assert native.decode_attention_fn(8, 2, 64, 0.1, torch.bfloat16, CPU) is None
    assert native.decode_attention_fn(8, 2, 64, 0.1, torch.float32, "cuda") is None  # CPU memory only
    attend = native.decode_attention_fn(4, 2, 16, 0.25, torch.float32, CPU)
    keys, values = cached(1, 2, 5, 16)
    q, lengths = torch.randn(1, 4, 16), torch.tensor([5])
    assert attend(q, keys.transpose(2, 3).contiguous().transpose(2, 3), values, lengths) is None   # positions not rows
    assert attend(q, keys, values, torch.tensor([5, 5])) is None                                  # lengths of other rows
    assert attend(torch.randn(1, 6, 16), keys, values, lengths) is None                          # other head counts
    assert attend(q, *cached(1, 3, 5, 16), lengths) is None
    assert attend(q, keys, values, lengths.int()) is None
    assert attend(q, keys, values, lengths) is not None
    for wrong in (torch.tensor([6]), torch.tensor([0])):                         # past the keys, or none: refused
        with pytest.raises(ValueError, match="lengths"):
            attend(q, keys, values, wrong)


@needs_native
@pytest.mark.parametrize("rank, inputs, outputs", [(8, 576, 1536), (1, 40, 37), (64, 64, 192)])
def test_lora_add_matches_torch_and_gives_each_row_its_own_sums(rank, inputs, outputs):
    torch.manual_seed(0)
    a, b = torch.randn(rank, inputs) * 0.1, torch.randn(outputs, rank) * 0.1
    x, y = torch.randn(6, inputs), torch.randn(6, outputs + 5)[:, 2:2 + outputs]     # y: strided rows, a slice
    lora_add = native.lora_add_fn(a, b.t(), 1.5)                                     # Bᵀ not contiguous: copied
    want = y + 1.5 * (x @ a.t()) @ b.t()
    got = lora_add(y.clone(), x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for i in range(6):                                                           # alone, the same bits
        assert torch.equal(lora_add(y[i:i + 1].clone(), x[i:i + 1])[0], got[i])


@needs_native
def test_lora_add_refuses_what_it_does_not_take():
    a, b_t = torch.randn(4, 32), torch.randn(4, 16)
    assert native.lora_add_fn(a.bfloat16(), b_t.bfloat16(), 1.0) is None        # fp32 factors only
    assert native.lora_add_fn(torch.randn(300, 32), torch.randn(300, 16), 1.0) is None   # rank over MAX_RANK
    lora_add = native.lora_add_fn(a, b_t, 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        lora_add(torch.zeros(2, 16), torch.randn(2, 31))
    with pytest.raises(ValueError, match="do not fit"):
        lora_add(torch.zeros(2, 16).bfloat16(), torch.randn(2, 32))


@needs_native
@pytest.mark.parametrize("rows, inputs, outputs", [(1, 576, 37), (5, 96, 64), (9, 1536, 20)])
def test_sign_add_is_alpha_times_the_signs_product_and_gives_each_row_its_own_sums(rows, inputs, outputs):
    """y += α ⊙ (S·x) with x rounded to int8 per group of 32 (native.rounded); blocks
    of 32 rows of S, chunks of 4 groups, and their tails; a row alone gets bit for bit what it gets
    among other rows; y may be a strided slice."""
    torch.manual_seed(0)
    signs = torch.randint(0, 2, (outputs, inputs)).float() * 2 - 1
    alpha, x = torch.rand(outputs) * 0.01, torch.randn(rows, inputs)
    sign_add = native.sign_add_fn(pack_signs(signs), alpha, inputs)
    y = torch.randn(rows, outputs + 8)[:, 4:4 + outputs]                             # strided rows
    want = y.double() + (native.rounded(x, 8).double() @ signs.double().t()) * alpha.double()
    start = y.clone()
    got = sign_add(start.clone(), x)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    sign_add(y, x)                                                                   # in place, through the stride
    assert torch.equal(y, got)
    for i in range(rows):
        assert torch.equal(sign_add(start[i:i + 1].clone(), x[i:i + 1])[0], got[i])


@needs_native
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_row_holding_nan_or_inf_gives_nan_and_leaves_the_other_rows_alone(bad):
    """The integer products round x per group (x_rows.h): a group with no finite step makes its
    row's outputs NaN, as a float product would, rather than finite numbers from garbage codes;
    the other rows are the same as without it. A zero row gives zeros (its step is 0)."""
    torch.manual_seed(0)
    rows, inputs = 32, 128
    q = torch.randint(0, 16, (rows, inputs), dtype=torch.uint8)
    scale, zero = (torch.rand(rows, inputs // 32) * 0.1).bfloat16(), (torch.randn(rows, inputs // 32) * 0.1).bfloat16()
    codes, block_scale, block_zero = native.int4_layout(q, scale, zero)
    signs, alpha = pack_signs(torch.randint(0, 2, (rows, inputs)).float() * 2 - 1), torch.rand(rows) * 0.01
    x = torch.randn(3, inputs)
    x[1, 40] = bad
    x[2] = 0.0
    y = torch.empty(3, rows)
    assert native.library().zenedge_int4_gemm(x.data_ptr(), codes.data_ptr(), block_scale.data_ptr(),
                                              block_zero.data_ptr(), y.data_ptr(), 3, rows, inputs) == 0
    alone = torch.empty(1, rows)
    assert native.library().zenedge_int4_gemm(x[:1].contiguous().data_ptr(), codes.data_ptr(), block_scale.data_ptr(),
                                              block_zero.data_ptr(), alone.data_ptr(), 1, rows, inputs) == 0
    assert torch.equal(y[0], alone[0]) and y[1].isnan().all() and torch.equal(y[2], torch.zeros(rows))
    base = torch.zeros(3, rows)
    after = native.sign_add_fn(signs, alpha, inputs)(base.clone(), x)
    assert torch.isfinite(after[0]).all() and after[1].isnan().all() and torch.equal(after[2], base[2])


def test_sign_add_refuses_what_it_does_not_take():
    signs, alpha = pack_signs(torch.ones(16, 64)), torch.ones(16)
    assert native.sign_add_fn(signs, alpha.double(), 64) is None                     # fp32 α only
    assert native.sign_add_fn(pack_signs(torch.ones(16, 48)), alpha, 48) is None         # inputs in groups of 32
    assert native.sign_add_fn(signs, alpha[:8], 64) is None                          # α per output
    if native.library() is None:
        return
    sign_add = native.sign_add_fn(signs, alpha, 64)
    with pytest.raises(ValueError, match="sign_add"):
        sign_add(torch.zeros(2, 16), torch.randn(2, 32))
    with pytest.raises(ValueError, match="sign_add"):
        sign_add(torch.zeros(2, 16).bfloat16(), torch.randn(2, 64))


@needs_native
@pytest.mark.parametrize("rows, inputs", [(37, 96), (64, 100), (5, 7)])
def test_sign_dense_rows_are_torchs_w_plus_alpha_signs_bit_for_bit(rows, inputs):
    """The prefill's dense W + α⊙S (sign_add.c's zenedge_sign_dense) is torch's addcmul, bit for bit,
    for any number of inputs, strided weight rows, any range of rows, with the signs kept either way."""
    torch.manual_seed(0)
    weight = torch.randn(rows, inputs + 3)[:, :inputs] * 0.05                       # strided rows
    signs = torch.randint(0, 2, (rows, inputs)).float() * 2 - 1
    alpha = torch.rand(rows) * 0.01
    want = torch.addcmul(weight, signs, alpha[:, None])
    row_major = pack_signs(signs)
    for bits in (row_major, row_major.t().contiguous().t()):                        # the file's order, the runtime's
        dense_rows = native.sign_dense_fn(weight, bits, alpha)
        assert torch.equal(dense_rows(0, rows), want) and torch.equal(dense_rows(3, rows), want[3:])
    assert native.sign_dense_fn(weight.double(), row_major, alpha) is None          # fp32 weights only


def test_the_library_is_built_once_per_source():
    """Named by a hash of the sources and flags: a second process loads the same file."""
    if native.library() is None:
        pytest.skip(f"native kernels off here ({native.off_reason()})")
    built = sorted(native.paths.kernel_cache().glob("cpu-kernels-*.so"))
    assert built
    code = "from zenedge.kernels import native; print(native.library()._name)"
    name = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ZENEDGE_NATIVE_KERNELS": "1"},
                          capture_output=True, text=True, check=True).stdout.strip()
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
    if native.paths.c_compiler() is None:
        pytest.skip("no C compiler")
    with pytest.raises(OSError, match="not private"):
        native.build("scalar")
    with pytest.raises(OSError, match="not private"):
        native._open(native._build("cpu-probe", (native.PROBE,), ()))


def test_models_the_kernels_cannot_serve_never_build_them():
    """A bf16 (or CUDA) model's norms and attention ask, and get None without a build or a self-test."""
    code = ("import torch; from zenedge.kernels import native;"
            "assert native.rms_norm_fn(torch.randn(8).bfloat16(), 1e-5) is None;"
            "assert native.decode_attention_fn(4, 2, 64, 0.1, torch.float32, 'cuda') is None;"
            "print(native._loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def _products_on(threads: int, lib, inputs: dict) -> list[torch.Tensor]:
    """The int4, Q8_0-head and sign products of `inputs` on `threads` threads of the C kernels."""
    assert native.set_threads(threads) == threads
    try:
        x, (codes, scale, zero), (head, head_scale), (signs, alpha) = (inputs[k] for k in ("x", "int4", "int8", "signs"))
        rows, n = x.shape[0], scale.shape[0] * native.BLOCK_ROWS
        int4, int8 = torch.empty(rows, n), torch.empty(rows, 1000)
        assert lib.zenedge_int4_gemm(x.data_ptr(), codes.data_ptr(), scale.data_ptr(), zero.data_ptr(), int4.data_ptr(),
                                     rows, n, x.shape[1]) == 0
        assert lib.zenedge_int8_gemm(x.data_ptr(), head.data_ptr(), head_scale.data_ptr(), int8.data_ptr(), rows, 1000,
                                     x.shape[1]) == 0
        added = torch.ones(rows, alpha.shape[0])
        assert lib.zenedge_sign_add(x.data_ptr(), signs.data_ptr(), alpha.data_ptr(), added.data_ptr(), rows,
                                    x.shape[1], alpha.shape[0], x.shape[1], alpha.shape[0]) == 0
        return [int4, int8, added]
    finally:
        native.set_threads(1)


@pytest.mark.skipif(native.library() is None, reason="no native CPU kernels on this machine")
def test_the_thread_count_changes_no_bit_of_a_product():
    """pool.c splits output rows (int4 and Q8_0 blocks, sign columns) over the threads; each output
    is summed by one thread as on one, so 1, 2 and 5 threads give the same bits."""
    g = torch.Generator().manual_seed(3)
    rows, inputs, outputs = 3, 256, 1040                        # 65 blocks of 16 rows; 1040 sign columns
    q = torch.randint(0, 16, (outputs, inputs), generator=g, dtype=torch.uint8)
    scale = (torch.rand(outputs, inputs // 32, generator=g) * 0.1).to(torch.bfloat16)
    zero = (torch.randn(outputs, inputs // 32, generator=g) * 0.1).to(torch.bfloat16)
    head = torch.randint(-127, 128, (1000, inputs), generator=g, dtype=torch.int8)
    head_scale = (torch.rand(1000, inputs // 32, generator=g) * 0.01).half()
    packed = torch.randint(0, 256, (outputs, inputs // 8), generator=g, dtype=torch.uint8)
    made = {"x": torch.randn(rows, inputs, generator=g), "int4": native.int4_layout(q, scale, zero),
            "int8": native.int8_layout(head, head_scale),
            "signs": (packed.t().contiguous(), torch.rand(outputs, generator=g) * 0.01)}
    lib = native.library()
    one = _products_on(1, lib, made)
    for threads in (2, 5):
        assert all(torch.equal(a, b) for a, b in zip(one, _products_on(threads, lib, made)))
