"""zenedge's C kernels for the CPU, compiled on first use with the system's C compiler.

- `int4_gemv.c`: y = x·Wᵀ for weight-only int4 W, summed in integers (cpu_weights.NativeInt4Weight);
- `int8_gemv.c`: y = x·Wᵀ for int8 W in groups of 32 (Q8_0; cpu_weights.NativeInt8Weight, the head);
- `rms_norm.c`: RMSNorm of fp32 rows (the lean forward's norms);
- `decode_attention.c`: one query per row over the KV cache (the lean decode step's attention);
- `lora_add.c`: y += scale·(x·Aᵀ)·Bᵀ, a LoRA on a decode step's rows (runtime/layers.py);
- `sign_add.c`: y += α ⊙ (S·x), a packed 1-bit BitDelta on a decode step's rows (runtime/layers.py),
  and the dense W + α⊙S rows its prefill multiplies with (kernels/bitdelta/cpu.py);
- `decode_step.c`: a whole decode step of a Llama-family layer stack in one call, through the
  kernels above (runtime/lean_llama.py), its rows on any mix of variants, and SiLU(gate)·up;
- `lanes.h`: the 16-lane fp32 vector they are all written in, once per instruction set, and e^x;
- `x_rows.h`: x rounded to int16 or int8 per group of 32, as the int4 and sign kernels multiply it;
- `pool.c`: the threads the products split their output rows over (`set_threads`);
- `kernels.h`: their C signatures (for decode_step.c, and the tests' C driver);
- `cpu_features.c`: which instruction sets this CPU runs (built apart, with no such flags).

Each is built for one instruction set: AVX-512 BF16, AVX2 + FMA + F16C (Intel Core, older AMD),
NEON (ARM64: Apple Silicon, ARM laptops and servers), or the portable scalar reference. The best
one this CPU runs is chosen at run time (`isa()`; ZENEDGE_CPU_ISA forces one). They give the same
bits on every instruction set (lanes.h says how), which tests/kernels/native checks against the
scalar build, and under qemu for ARM64.

Every kernel sums a row of its input the same way whatever the other rows are, so a request
decodes the same tokens alone as in a batch (torch's fp32 BLAS calls take other paths for one row).
The products (int4, the Q8_0 head, the sign slices) and the decode step's attention split their
output rows over the calling thread's count (`set_threads`; pool.c: the caller and persistent
workers taking chunks as they come free, so a worker on a busy core holds up little), each output
summed by one thread: the count changes no bit. runtime/threads.py sets the count per forward.

Nothing here is required: where the CPU runs none of those instruction sets, no compiler is found,
the build or a self-test fails, or ZENEDGE_NATIVE_KERNELS=0, `library()` is None and callers keep
torch's own ops. The library is built once per machine (about a second) into the user cache directory,
named by a hash of the sources and flags, written to a temporary name and renamed, so concurrent
first uses never load a half-written file. Each call is then one ctypes call (the GIL is
released while the kernel runs); the callers check shapes, since the kernels trust them.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from zenedge import paths
from zenedge.bitdelta.packing import unpack_signs
from zenedge.errors import ConfigError

log = logging.getLogger("zenedge.kernels")

SOURCES = tuple(Path(__file__).with_name(name) for name in
                ("int4_gemv.c", "int8_gemv.c", "rms_norm.c", "decode_attention.c", "lora_add.c", "sign_add.c",
                 "decode_step.c", "pool.c"))
HEADERS = tuple(Path(__file__).with_name(name) for name in ("lanes.h", "x_rows.h", "kernels.h", "pool.h"))
PROBE = Path(__file__).with_name("cpu_features.c")
# -ffp-contract=off: a multiply and an add stay two roundings, as the torch ops they stand for.
FLAGS = ("-O3", "-std=c11", "-ffp-contract=off", "-pthread", "-shared", "-fPIC")
ISA_FLAGS = {
    "avx512vnni": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni", "-mfma", "-DZENEDGE_AVX512",
                   "-DZENEDGE_VNNI"),    # avx512 plus VPDPBUSD for the int8-activation product
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-DZENEDGE_AVX512"),
    "avx2": ("-mavx2", "-mfma", "-mf16c", "-DZENEDGE_AVX2"),
    "neon": ("-DZENEDGE_NEON",),
    "scalar": (),                    # the portable reference: any CPU, slower than torch's kernels
}
FEATURES = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx2", "fma", "f16c", "neon", "dotprod",
            "avx512_vnni")  # cpu_features.c's bits
ISA_NEEDS = {"avx512vnni": ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "fma"),
             "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "fma"), "avx2": ("avx2", "fma", "f16c"),
             "neon": ("neon",), "scalar": ()}
PREFERENCE = ("avx512vnni", "avx512", "avx2", "neon")   # what `isa()` picks, best first; scalar only when asked for
MAX_INPUTS = 32768          # int4_gemv.c's and int8_gemv.c's MAX_INPUTS
MAX_HEAD_DIM = 256          # decode_attention.c's MAX_DIM
MAX_GROUP = 64              # decode_attention.c's MAX_GROUP
MAX_RANK = 256              # lora_add.c's MAX_RANK
MAX_SLICES = 3              # decode_step.c's MAX_SLICES: LoRA or sign slices a variant adds to a product
SIGN_GROUP = 32             # sign_add.c takes inputs in whole groups of 32

_lock = threading.RLock()       # library() asks isa() while it holds it
_loaded: list = []          # [the library, or None]: decided once per process
_off: list = []             # [why the library is None], where it is
_chosen: list = []          # [(instruction set or None, why)]: decided once per process

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "zenedge_int4_gemm": [_P] * 5 + [_I] * 3,
    "zenedge_int4_gemm_scaled": [_P] * 5 + [_I] * 4,
    "zenedge_int4_gemm_x8": [_P] * 5 + [_I] * 4,
    "zenedge_int8_gemm": [_P] * 4 + [_I] * 3,
    "zenedge_rms_norm": [_P] * 3 + [_I] * 2 + [_F],
    "zenedge_decode_attention": [_P] * 5 + [_I] * 8 + [_F],
    "zenedge_lora_add": [_P] * 4 + [_I] * 6 + [_F],
    "zenedge_sign_add": [_P] * 4 + [_I] * 5,
    "zenedge_sign_dense": [_P] * 4 + [_I] * 5,
    "zenedge_silu_mul": [_P, _P, _I, _I],
    "zenedge_decode_step": [_P, _I, _P, _I, _P, _P, _P, _P, _P, _I],
}
_COUNTS = {"zenedge_set_threads": [_I], "zenedge_threads": []}     # pool.c: these return int64


# decode_step.c's structures, field for field
class Lora(ctypes.Structure):
    _fields_ = [("a", _P), ("bt", _P), ("rank", _I), ("offset", _I), ("width", _I), ("scale", _F)]


class Signs(ctypes.Structure):
    _fields_ = [("signs", _P), ("alpha", _P), ("offset", _I), ("width", _I)]


class Delta(ctypes.Structure):
    _fields_ = [("rows", _P), ("count", _I), ("loras", _I), ("signs", _I), ("lora", Lora * MAX_SLICES),
                ("sign", Signs * MAX_SLICES)]


class Product(ctypes.Structure):
    _fields_ = [("codes", _P), ("scale", _P), ("zero", _P), ("kind", _I), ("rows", _I), ("inputs", _I),
                ("deltas", _I), ("delta", ctypes.POINTER(Delta))]


class Layer(ctypes.Structure):
    _fields_ = [("norm1", _P), ("norm2", _P), ("eps1", _F), ("eps2", _F), ("qkv", Product), ("o", Product),
                ("gate_up", Product), ("down", Product), ("keys", _P), ("values", _P), ("strides", _I * 3)]


class Shape(ctypes.Structure):
    _fields_ = [("hidden", _I), ("heads", _I), ("kv_heads", _I), ("dim", _I), ("intermediate", _I),
                ("attention_scale", _F)]


def library():
    """The loaded kernels (ctypes functions by their C names), or None where they are not
    available here (the reason is logged once). Raises ConfigError where ZENEDGE_CPU_ISA asks for
    an instruction set this CPU does not run."""
    return _once(_loaded, _load)


def off_reason() -> str | None:
    """Why `library()` is None here, or None while the kernels are loaded (what `doctor` and
    /api/ps report). Decides, building the library if nothing has asked for it yet."""
    try:
        if library() is not None:
            return None
    except ConfigError as exc:
        return str(exc)
    return _off[0] if _off else "turned off in this process"


def isa() -> tuple[str | None, str]:
    """(the instruction set the kernels are built for here, or None; why): e.g. ("avx2", "the CPU has
    avx2, fma, f16c; not avx512_bf16"). Raises ConfigError for a ZENEDGE_CPU_ISA this CPU cannot run."""
    return _once(_chosen, _choose)


def in_use() -> tuple[str | None, str]:
    """(the instruction set of the loaded kernels, why it) or (None, why they are off): what
    `doctor`, /api/ps and the benchmarks report."""
    off = off_reason()
    return (None, off) if off is not None else isa()


def _once(slot: list, decide):
    """slot[0], decided by `decide()` the first time any thread asks; a ConfigError decided is raised."""
    if not slot:
        with _lock:
            if not slot:
                slot.append(decide())
    if isinstance(slot[0], ConfigError):
        raise slot[0]
    return slot[0]


def runnable_isas() -> list[str]:
    """Every instruction set the kernels can be built for that this CPU runs, the scalar reference last."""
    features = cpu_features()
    return [name for name in (*PREFERENCE, "scalar") if all(f in features for f in ISA_NEEDS[name])]


@functools.cache
def cpu_features() -> frozenset[str]:
    """This CPU's features that the kernels' instruction sets need (cpu_features.c); empty where
    the probe cannot be built (no compiler)."""
    if paths.c_compiler() is None:
        return frozenset()
    try:
        probe = _open(_build("cpu-probe", (PROBE,), ()))
    except (OSError, subprocess.SubprocessError) as exc:
        text = str(exc).strip()
        log.info("the CPU probe could not be built (%s)", text.splitlines()[-1] if text else repr(exc))
        return frozenset()
    probe.zenedge_cpu_features.restype = ctypes.c_int64
    bits = probe.zenedge_cpu_features()
    return frozenset(name for i, name in enumerate(FEATURES) if bits >> i & 1)


def _choose():
    forced = paths.cpu_isa()
    if forced == "off":
        return None, "ZENEDGE_CPU_ISA=off"
    if forced is not None and forced not in ISA_FLAGS:
        return ConfigError(f"ZENEDGE_CPU_ISA={forced!r} is not one of {', '.join((*ISA_FLAGS, 'off'))}")
    features = cpu_features()
    if forced is not None:
        missing = [f for f in ISA_NEEDS[forced] if f not in features]
        if missing:
            return ConfigError(f"ZENEDGE_CPU_ISA={forced}, but this CPU does not run it (it lacks {', '.join(missing)})")
        return forced, f"ZENEDGE_CPU_ISA={forced}"
    for name in PREFERENCE:
        if all(f in features for f in ISA_NEEDS[name]):
            why = f"the CPU has {', '.join(ISA_NEEDS[name])}"
            if name in ("avx512", "avx2"):   # on x86, say why not the best
                why += f"; not {', '.join(f for f in ISA_NEEDS['avx512vnni'] if f not in features)}"
            return name, why
    if not features:
        return None, "the CPU's features could not be probed (no C compiler, or its build failed)"
    return None, "the CPU runs none of AVX-512 BF16, AVX2 + FMA + F16C, NEON"


def int4_gemm():
    """`zenedge_int4_gemm(x, codes, scale, zero, y, M, N, K)` (int4_gemv.c), or None."""
    lib = library()
    return lib.zenedge_int4_gemm if lib is not None else None


def int4_gemm_scaled():
    """`zenedge_int4_gemm_scaled(x, codes, scale, zero, y, M, N, K, kind)` (int4_gemv.c), or None;
    kind = SCALE_KINDS[scale.dtype]."""
    lib = library()
    return lib.zenedge_int4_gemm_scaled if lib is not None else None


def int4_gemm_x8():
    """`zenedge_int4_gemm_x8(x, codes, scale, zero, y, M, N, K, kind)` (int4_gemv.c: x rounded to
    int8, `rounded(x, 8)`), or None."""
    lib = library()
    return lib.zenedge_int4_gemm_x8 if lib is not None else None


# int4_gemv.c's SCALES_*, told apart by the scales' dtype: bf16 scale and zero, W = (q - 8)·s + z
# (zenedge's quantizer); fp16 or fp32 scale and minimum, W = q·s + m (GGUF's blocks, kept exactly)
SCALE_KINDS = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}

BLOCK_ROWS = 16             # int4_gemv.c and int8_gemv.c ROWS: rows of W per block of their layouts


def int4_layout(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor):
    """int4_gemv.c's layout of int4 codes q [N, K] (0..15) with scale and zero [N, K/32] (of one of
    SCALE_KINDS' dtypes): (codes uint8 [N/16, K/8, 64], scale and zero [N/16, K/32, 16]); N a
    multiple of 16."""
    rows, inputs = q.shape
    blocks = q.to(torch.uint8).view(rows // BLOCK_ROWS, BLOCK_ROWS, inputs // 8, 2, 4).transpose(1, 2)  # [B, K/8, 16, 2, 4]
    codes = blocks[..., 0, :] | (blocks[..., 1, :] << 4)
    per_block = [t.view(rows // BLOCK_ROWS, BLOCK_ROWS, -1).transpose(1, 2).contiguous() for t in (scale, zero)]
    return codes.reshape(rows // BLOCK_ROWS, inputs // 8, 4 * BLOCK_ROWS).contiguous(), *per_block


def int4_codes(codes: torch.Tensor) -> torch.Tensor:
    """The int4 codes q [N, K] back from int4_layout's codes."""
    blocks, chunks, _ = codes.shape
    lanes = codes.view(blocks, chunks, BLOCK_ROWS, 4)
    nibbles = torch.stack((lanes & 0xF, lanes >> 4), -2)                  # [B, K/8, 16, 2, 4]
    return nibbles.transpose(1, 2).reshape(blocks * BLOCK_ROWS, chunks * 8)


def rounded(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x [..., K] as the kernels multiply it (x_rows.h): rounded per group of 32 inputs to `bits`
    bits (16: the int4 kernel, 8: its x8 variant and the sign kernel), the step max|x|/(2^(bits-1) - 1), to nearest
    even; in fp32 (for the self-tests and the tests' references)."""
    groups = x.float().reshape(*x.shape[:-1], -1, 32)
    limit = 2 ** (bits - 1) - 1
    step = groups.abs().amax(-1, keepdim=True) / limit
    inverse = torch.where(step != 0, 1 / step, torch.zeros_like(step))
    return (torch.round(groups * inverse).clamp(-limit, limit) * step).reshape(x.shape)


def int8_layout(codes: torch.Tensor, scale: torch.Tensor):
    """int8_gemv.c's layout of int8 codes [N, K] with fp16 scales [N, K/32]: (codes int8 [B, K, 16],
    scale fp16 [B, K/32, 16]) for B = ceil(N/16) blocks, rows past N zero."""
    rows = codes.shape[0]
    pad = -rows % BLOCK_ROWS
    blocks = []
    for t in (codes, scale):
        if pad:
            t = torch.cat((t, t.new_zeros((pad, t.shape[1]))))
        blocks.append(t.view(-1, BLOCK_ROWS, t.shape[1]).transpose(1, 2).contiguous())
    return blocks[0], blocks[1]


def int8_gemm():
    """`zenedge_int8_gemm(x, codes, scale, y, M, N, K)` (int8_gemv.c), or None."""
    lib = library()
    return lib.zenedge_int8_gemm if lib is not None else None


def rms_norm_fn(weight: torch.Tensor, eps: float):
    """x [..., K] fp32 contiguous → RMSNorm(x)·weight through the C kernel, or None where it
    does not apply (no library, weight not fp32 on the CPU)."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 1:
        return None                  # (checked first: a CUDA model never builds the CPU kernels)
    lib = library()
    if lib is None:
        return None
    kernel, width, w, eps = lib.zenedge_rms_norm, weight.shape[0], weight.detach().contiguous(), float(eps)
    pointer = w.data_ptr()

    def rms_norm(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.shape[-1] != width or not x.is_contiguous():
            return F.rms_norm(x, (width,), w, eps)
        y = torch.empty_like(x)
        kernel(x.data_ptr(), pointer, y.data_ptr(), x.numel() // width, width, eps)
        return y
    return rms_norm


def decode_attention_fn(heads: int, kv_heads: int, dim: int, scale: float, dtype: torch.dtype,
                        device: torch.device):
    """(q [B, H, D] with heads contiguous, keys/values [B, H_kv, L, D] with positions contiguous
    as the static cache gives them, lengths int64 [B]: row b attends over its first lengths[b]
    positions) → [B, H, D] through the C kernel, or None for tensors laid out otherwise (the caller
    then uses SDPA). None where the kernel does not apply at all (no library, not fp32 on the CPU,
    head sizes it does not take)."""
    if dtype != torch.float32 or torch.device(device).type != "cpu" or dim % 16 or dim > MAX_HEAD_DIM \
            or heads % kv_heads or heads // kv_heads > MAX_GROUP:
        return None                  # (checked first: a CUDA model never builds the CPU kernels)
    lib = library()
    if lib is None:
        return None
    kernel, scale, rows_tail, float32 = lib.zenedge_decode_attention, float(scale), (dim, 1), torch.float32

    def attend(q, keys, values, lengths):
        # The kernel trusts every size and stride it is given (it checks the lengths against L
        # itself): anything unexpected goes to SDPA.
        batch, length = q.shape[0], keys.shape[2]
        if q.shape[1:] != (heads, dim) or keys.shape != (batch, kv_heads, length, dim) \
                or values.shape != keys.shape or lengths.shape != (batch,) or lengths.dtype != torch.int64 \
                or lengths.device.type != "cpu" or not lengths.is_contiguous() \
                or q.stride()[1:] != rows_tail or keys.stride()[2:] != rows_tail or values.stride() != keys.stride() \
                or not (q.dtype is keys.dtype is values.dtype is float32):
            return None
        out = q.new_empty((batch, heads, dim))
        status = kernel(q.data_ptr(), keys.data_ptr(), values.data_ptr(), lengths.data_ptr(), out.data_ptr(), batch,
                        heads, kv_heads, length, dim, q.stride(0), keys.stride(0), keys.stride(1), scale)
        if status == -2:
            raise ValueError(f"attention lengths must be within 1..{length}")
        if status:
            raise MemoryError("the decode attention kernel could not allocate its scratch")
        return out
    return attend


def lora_add_fn(a: torch.Tensor, b_t: torch.Tensor, scale: float):
    """`(y [M, N], x [M, K]) → y += scale·(x·Aᵀ)·Bᵀ` in place through the C kernel, for LoRA
    factors A [r, K] and Bᵀ [r, N] (contiguous where it matters: a copy is made otherwise); None
    where it does not apply (no library, factors not fp32 on the CPU, a rank over MAX_RANK).
    Whether it applies depends on the factors only, never on the rows: a row takes the same path
    alone as in a batch."""
    if a.dtype != torch.float32 or b_t.dtype != torch.float32 or a.device.type != "cpu" \
            or b_t.device.type != "cpu" or a.dim() != 2 or b_t.dim() != 2 or b_t.shape[0] != a.shape[0] \
            or not 1 <= a.shape[0] <= MAX_RANK:
        return None
    lib = library()
    if lib is None:
        return None
    kernel, scale = lib.zenedge_lora_add, float(scale)
    a, b_t = a.detach().contiguous(), b_t.detach().contiguous()
    rank, inputs, outputs = a.shape[0], a.shape[1], b_t.shape[1]
    factors = (a, b_t, a.data_ptr(), b_t.data_ptr())     # the tensors live as long as this function

    def lora_add(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = _rows_fitting(y, x, inputs, outputs, "lora_add", f"A [{rank}, {inputs}], Bᵀ [{rank}, {outputs}]")
        rows = x.shape[0]
        if kernel(x.data_ptr(), factors[2], factors[3], y.data_ptr(), rows, inputs, outputs, rank, x.stride(0),
                  y.stride(0), scale):
            raise MemoryError("the LoRA kernel could not allocate its scratch")
        return y
    return lora_add


def sign_add_fn(packed: torch.Tensor, alpha: torch.Tensor, in_features: int):
    """`(y [M, N], x [M, K]) → y += α ⊙ (S·x)` in place through the C kernel, for a packed 1-bit
    delta (packed uint8 [N, K/8], LSB first; α fp32 [N]); None where it does not apply (no library,
    not on the CPU, K not whole groups of 32). Decided by the delta alone, never by the rows. The
    kernel reads the signs by input byte, [K/8, N]: free where `packed` is that tensor transposed,
    as the runtime keeps it (runtime/variants.py), a copy otherwise."""
    if packed.dtype != torch.uint8 or alpha.dtype != torch.float32 or packed.device.type != "cpu" \
            or alpha.device.type != "cpu" or packed.dim() != 2 or in_features % SIGN_GROUP \
            or not 0 < in_features <= MAX_INPUTS or packed.shape != (alpha.shape[0], in_features // 8):
        return None
    lib = library()
    if lib is None:
        return None
    kernel, outputs = lib.zenedge_sign_add, packed.shape[0]
    by_input, alpha = packed.t().contiguous(), alpha.contiguous()   # no copy where the runtime keeps them so
    held = (by_input, alpha, by_input.data_ptr(), alpha.data_ptr())   # the tensors live as long as this function

    def sign_add(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = _rows_fitting(y, x, in_features, outputs, "sign_add", f"signs [{outputs}, {in_features}]")
        rows = x.shape[0]
        if kernel(x.data_ptr(), held[2], held[3], y.data_ptr(), rows, in_features, outputs, x.stride(0), y.stride(0)):
            raise MemoryError("the sign kernel could not allocate its scratch")
        return y
    return sign_add


def sign_dense_fn(weight: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor):
    """`(start, stop) → W[start:stop] + α ⊙ S[start:stop]`, fp32 [stop - start, in], through the C
    kernel (sign_add.c's zenedge_sign_dense: the same numbers as torch's W + S·α, each weight rounded
    once), for a prefill's dense rows; None where it does not apply (no library, not fp32 on the CPU).
    The signs are read by input byte, as the runtime keeps them (a copy otherwise)."""
    out_features, in_features = weight.shape
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.stride(1) != 1 \
            or packed.dtype != torch.uint8 or packed.shape != (out_features, (in_features + 7) // 8) \
            or alpha.shape != (out_features,) or packed.device.type != "cpu" or alpha.device.type != "cpu":
        return None
    lib = library()
    if lib is None:
        return None
    by_input, alpha = packed.t().contiguous(), alpha.float().contiguous()

    def dense_rows(start: int, stop: int) -> torch.Tensor:
        if not 0 <= start <= stop <= out_features:
            raise ValueError(f"sign_dense: rows {start}..{stop} of a weight with {out_features}")
        out = torch.empty(stop - start, in_features)
        lib.zenedge_sign_dense(weight.data_ptr(), by_input.data_ptr(), alpha.data_ptr(), out.data_ptr(), start, stop,
                               in_features, out_features, weight.stride(0))
        return out
    return dense_rows


def _rows_fitting(y: torch.Tensor, x: torch.Tensor, inputs: int, outputs: int, kernel: str,
                  operand: str) -> torch.Tensor:
    """x with unit column stride, after checking that y [M, outputs] (rows may be strided) and
    x [M, inputs] are fp32 on the CPU, as the in-place row kernels (LoRA, signs) read them: they
    trust every size they are given. Raises ValueError naming the kernel and its operand otherwise."""
    if x.dtype is not torch.float32 or y.dtype is not torch.float32 or not (x.is_cpu and y.is_cpu) \
            or y.stride(1) != 1 or x.dim() != 2 or x.shape[1] != inputs or y.shape != (x.shape[0], outputs):
        raise ValueError(f"{kernel}: y {tuple(y.shape)} {y.dtype}, x {tuple(x.shape)} {x.dtype} do not fit {operand}")
    return x if x.stride(1) == 1 else x.contiguous()


def silu_mul_fn(intermediate: int):
    """gu [M, 2·I] fp32 contiguous (gate and up side by side) → SiLU(gate)·up [M, I] through the C
    kernel (the one decode_step.c uses: a Python step and a C step round alike), or None."""
    lib = library()
    if lib is None:
        return None
    kernel, width = lib.zenedge_silu_mul, 2 * intermediate

    def silu_mul(gu: torch.Tensor) -> torch.Tensor:
        if gu.dtype != torch.float32 or gu.dim() != 2 or gu.shape[1] != width or not gu.is_contiguous():
            raise ValueError(f"silu_mul: gu {tuple(gu.shape)} {gu.dtype} is not [M, {width}] contiguous fp32")
        out = gu.new_empty((gu.shape[0], intermediate))
        kernel(gu.data_ptr(), out.data_ptr(), gu.shape[0], intermediate)
        return out
    return silu_mul


def decode_step():
    """`zenedge_decode_step(x, n, layers, count, shape, cos, sin, positions, lengths, length)`
    (decode_step.c; structures Layer and Shape above), or None."""
    lib = library()
    return lib.zenedge_decode_step if lib is not None else None


_short_of_threads: set[int] = set()


def set_threads(threads: int) -> int:
    """Make the kernels called from this thread split their outputs over `threads` threads (this
    one included; 1: this thread alone): how many they will use. Fewer where workers could not be
    started (said once per count); 1 where the kernels are off."""
    lib = library()
    if lib is None:
        return 1
    got = int(lib.zenedge_set_threads(threads))
    if got < threads and threads not in _short_of_threads:
        _short_of_threads.add(threads)
        log.warning("the C kernels got %d of %d threads (the others could not be started): they run on %d", got,
                    threads, got)
    return got


def _load():
    reason = None if paths.native_kernels_enabled() else "ZENEDGE_NATIVE_KERNELS=0"
    if reason is None and paths.c_compiler() is None:
        reason = "no C compiler (set CC, or install gcc or clang)"
    if reason is None:
        try:
            name, why = isa()
        except ConfigError as exc:
            return exc
        if name is None:
            reason = why
        else:
            try:
                lib = build(name)
                failed = [test_name for test_name, test in _SELF_TESTS.items() if not test(lib)]
                if not failed:
                    log.info("native CPU kernels: %s (%s)", name, why)
                    return lib
                reason = f"self-test of {', '.join(failed)} ({name}) disagreed with torch"
            except (OSError, subprocess.SubprocessError) as exc:
                text = str(exc).strip()
                reason = f"build failed ({name}): {text.splitlines()[-1] if text else repr(exc)}"
    log.info("native CPU kernels off (%s): torch's kernels are used", reason)
    _off.append(reason)
    return None


def build(name: str):
    """The kernels built for the instruction set `name` (ISA_FLAGS), loaded, with no self-test; the
    caller makes sure this CPU runs it (tests build every variant it runs, to compare them)."""
    lib = _open(_build("cpu-kernels", SOURCES, ISA_FLAGS[name], headers=HEADERS))
    for function, argtypes in _SIGNATURES.items():
        kernel = getattr(lib, function)
        kernel.argtypes, kernel.restype = argtypes, ctypes.c_int
    for function, argtypes in _COUNTS.items():
        kernel = getattr(lib, function)
        kernel.argtypes, kernel.restype = argtypes, ctypes.c_int64
    return lib


def _build(stem: str, sources: tuple[Path, ...], flags: tuple[str, ...], headers: tuple[Path, ...] = ()) -> Path:
    """A shared library of `sources`, built once per machine: named by a hash of its sources,
    compiler and flags, written to a temporary name and renamed."""
    compiler = paths.c_compiler()
    if compiler is None:
        raise OSError("no C compiler")
    command = (compiler, *FLAGS, *flags)
    digest = hashlib.sha256(b"".join(source.read_bytes() for source in sources + headers)
                            + " ".join(command).encode()).hexdigest()[:16]
    target = paths.kernel_cache() / f"{stem}-{digest}{'.dylib' if sys.platform == 'darwin' else '.so'}"
    if not target.exists():
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".build-", suffix=target.suffix)
        os.close(fd)
        try:
            subprocess.run([*command, "-o", partial, *map(str, sources), "-lm"], check=True, capture_output=True,
                           text=True, timeout=120)
            os.replace(partial, target)
        except subprocess.CalledProcessError as exc:
            raise subprocess.SubprocessError(exc.stderr or str(exc)) from None
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return target


def _open(library: Path):
    _check_private(library)
    return ctypes.CDLL(str(library))


def _check_private(library: Path) -> None:
    """Loading a shared library runs its code: only one that this user owns and nobody else can
    write, in a directory nobody else can write (a cache directory pointed somewhere shared)."""
    for path in (library, library.parent):
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise OSError(f"{path} is not private to this user (owner {info.st_uid}, mode {oct(info.st_mode & 0o777)})")


# -- self-tests: each kernel against torch on small random inputs, once per process ---------------

def _int4_ok(lib) -> bool:
    g = torch.Generator().manual_seed(0)
    rows, inputs = 48, 128                          # 3 blocks of 16 rows, 4 groups
    q = torch.randint(0, 16, (rows, inputs), generator=g, dtype=torch.uint8)
    scale = (torch.rand(rows, inputs // 32, generator=g) * 0.1).to(torch.bfloat16)
    zero = (torch.randn(rows, inputs // 32, generator=g) * 0.1).to(torch.bfloat16)
    x = torch.randn(11, inputs, generator=g)        # 11 rows of x: a pass of 8 and one of 3
    codes, block_scale, block_zero = int4_layout(q, scale, zero)
    y = torch.empty(11, rows)
    if lib.zenedge_int4_gemm(x.data_ptr(), codes.data_ptr(), block_scale.data_ptr(), block_zero.data_ptr(),
                             y.data_ptr(), 11, rows, inputs):
        return False
    groups = q.float().view(rows, -1, 32) - 8
    weight = (groups * scale.float()[..., None] + zero.float()[..., None]).view(rows, inputs)
    if not torch.allclose(y, rounded(x, 16) @ weight.t(), rtol=1e-4, atol=1e-4):
        return False
    for dtype, kind in ((torch.float16, 1), (torch.float32, 2)):   # W = q·s + m
        s16, m16 = scale.to(dtype), zero.to(dtype)
        codes, block_scale, block_zero = int4_layout(q, s16, m16)
        if lib.zenedge_int4_gemm_scaled(x.data_ptr(), codes.data_ptr(), block_scale.data_ptr(), block_zero.data_ptr(),
                                        y.data_ptr(), 11, rows, inputs, kind):
            return False
        weight = (q.float().view(rows, -1, 32) * s16.float()[..., None] + m16.float()[..., None]).view(rows, inputs)
        if not torch.allclose(y, rounded(x, 16) @ weight.t(), rtol=1e-4, atol=1e-4):
            return False
        if lib.zenedge_int4_gemm_x8(x.data_ptr(), codes.data_ptr(), block_scale.data_ptr(), block_zero.data_ptr(),
                                    y.data_ptr(), 11, rows, inputs, kind):
            return False
        if not torch.allclose(y, rounded(x, 8) @ weight.t(), rtol=1e-4, atol=1e-4):
            return False
    return True


def _int8_ok(lib) -> bool:
    g = torch.Generator().manual_seed(0)
    rows, inputs = 39, 96                           # rows: 16-row blocks and a partial one; 3 groups
    codes = torch.randint(-127, 128, (rows, inputs), generator=g, dtype=torch.int8)
    scale = (torch.rand(rows, inputs // 32, generator=g) * 0.01).half()
    x = torch.randn(11, inputs, generator=g)         # 11 rows of x: a pass of 8 and one of 3
    y = torch.empty(11, rows)
    block_codes, block_scale = int8_layout(codes, scale)
    if lib.zenedge_int8_gemm(x.data_ptr(), block_codes.data_ptr(), block_scale.data_ptr(), y.data_ptr(), 11, rows,
                             inputs):
        return False
    weight = (codes.float().view(rows, -1, 32) * scale.float()[..., None]).view(rows, inputs)
    return bool(torch.allclose(y, x @ weight.t(), rtol=1e-4, atol=1e-5))


def _silu_mul_ok(lib) -> bool:
    g = torch.Generator().manual_seed(0)
    gu = torch.randn(3, 2 * 40, generator=g) * 6                   # 40 wide: a masked tail; e^-|x| far down
    out = torch.empty(3, 40)
    lib.zenedge_silu_mul(gu.data_ptr(), out.data_ptr(), 3, 40)
    return bool(torch.allclose(out, F.silu(gu[:, :40]) * gu[:, 40:], rtol=1e-5, atol=1e-6))


def _rms_norm_ok(lib) -> bool:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 100, generator=g), torch.randn(100, generator=g)   # 100: a masked tail
    y = torch.empty_like(x)
    lib.zenedge_rms_norm(x.data_ptr(), w.data_ptr(), y.data_ptr(), 3, 100, 1e-5)
    return bool(torch.allclose(y, F.rms_norm(x, (100,), w, 1e-5), rtol=1e-5, atol=1e-6))


def _attention_ok(lib) -> bool:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 32, generator=g)
    cache = torch.randn(2, 2, 2, 12, 32, generator=g)          # [kind, B, H_kv, capacity, D]
    keys, values = cache[0, :, :, :9], cache[1, :, :, :9]    # views, as the static cache gives
    lengths = torch.tensor([6, 9])
    out = torch.empty_like(q)
    if lib.zenedge_decode_attention(q.data_ptr(), keys.data_ptr(), values.data_ptr(), lengths.data_ptr(),
                                    out.data_ptr(), 2, 6, 2, 9, 32, q.stride(0), keys.stride(0), keys.stride(1), 0.2):
        return False
    for b in range(2):
        n = int(lengths[b])
        want = F.scaled_dot_product_attention(q[b:b + 1].view(1, 2, 3, 32), keys[b:b + 1, :, :n],
                                              values[b:b + 1, :, :n], scale=0.2)
        if not torch.allclose(out[b], want.view(6, 32), rtol=1e-4, atol=1e-5):
            return False
    return True


def _lora_ok(lib) -> bool:
    g = torch.Generator().manual_seed(0)
    x, a, b_t = torch.randn(3, 40, generator=g), torch.randn(5, 40, generator=g), torch.randn(5, 37, generator=g)
    y = torch.randn(3, 37, generator=g)   # 40 inputs, 37 outputs: the masked tails too
    want = y + 0.5 * (x @ a.t()) @ b_t
    if lib.zenedge_lora_add(x.data_ptr(), a.data_ptr(), b_t.data_ptr(), y.data_ptr(), 3, 40, 37, 5, 40, 37, 0.5):
        return False
    return bool(torch.allclose(y, want, rtol=1e-5, atol=1e-5))


def _sign_ok(lib) -> bool:
    g = torch.Generator().manual_seed(0)
    rows, inputs = 37, 96                           # a block of 32 rows and a tail; 3 groups of 32
    packed = torch.randint(0, 256, (rows, inputs // 8), generator=g, dtype=torch.uint8)
    alpha = torch.rand(rows, generator=g) * 0.01
    x, y = torch.randn(5, inputs, generator=g), torch.randn(5, rows, generator=g)
    want = y + (rounded(x, 8) @ unpack_signs(packed, inputs).t()) * alpha
    by_input = packed.t().contiguous()              # the kernel's [K/8, N]
    if lib.zenedge_sign_add(x.data_ptr(), by_input.data_ptr(), alpha.data_ptr(), y.data_ptr(), 5, inputs, rows,
                            inputs, rows):
        return False
    return bool(torch.allclose(y, want, rtol=1e-4, atol=1e-5))


def _sign_dense_ok(lib) -> bool:
    g = torch.Generator().manual_seed(0)
    rows, inputs = 9, 20                            # a partial byte of signs
    weight, alpha = torch.randn(rows, inputs, generator=g), torch.rand(rows, generator=g)
    packed = torch.randint(0, 256, (rows, 3), generator=g, dtype=torch.uint8)
    signs = unpack_signs(packed, inputs)
    by_input, out = packed.t().contiguous(), torch.empty(rows - 2, inputs)
    lib.zenedge_sign_dense(weight.data_ptr(), by_input.data_ptr(), alpha.data_ptr(), out.data_ptr(), 2, rows, inputs,
                           rows, inputs)
    return bool(torch.equal(out, torch.addcmul(weight, signs, alpha[:, None])[2:]))


_SELF_TESTS = {"int4_gemv": _int4_ok, "int8_gemv": _int8_ok, "rms_norm": _rms_norm_ok,
               "decode_attention": _attention_ok, "lora_add": _lora_ok, "sign_add": _sign_ok,
               "sign_dense": _sign_dense_ok, "silu_mul": _silu_mul_ok}
