"""The C kernels for the CPU (int4_gemv.c), compiled on first use with the system's C compiler.

Nothing here is required: where the CPU lacks AVX-512 BF16, no compiler is found, the build or
the self-test fails, or ZENEDGE_NATIVE_KERNELS=0, `int4_gemm()` is None and callers keep torch's
own kernels. The library is built once per machine (about a second) into the user cache
directory, named by a hash of the source and flags, written to a temporary name and renamed, so
concurrent first uses never load a half-written file. Then every call is one ctypes call: the GIL
is released while the kernel runs.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from zenedge import paths

log = logging.getLogger("zenedge.kernels")

SOURCE = Path(__file__).with_name("int4_gemv.c")
FLAGS = ("-O3", "-std=c11", "-shared", "-fPIC", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma")
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")   # as /proc/cpuinfo spells them

MAX_INPUTS = 32768          # as int4_gemv.c's MAX_INPUTS
_lock = threading.Lock()
_loaded: list = []          # [the library's function, or None]: decided once per process


def int4_gemm():
    """`zenedge_int4_gemm(x, codes, scale, zero, y, M, N, K)` (see int4_gemv.c), or None where
    the native kernel is not available here (the reason is logged once)."""
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def _load():
    reason = _unavailable_reason()
    if reason is None:
        try:
            function = _build_and_open()
            if _self_test(function):
                return function
            reason = "its self-test disagreed with torch"
        except (OSError, subprocess.SubprocessError) as exc:
            reason = f"build failed: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}"
    log.info("native int4 CPU kernel off (%s): torch's int4 kernel is used", reason)
    return None


def _unavailable_reason() -> str | None:
    if not paths.native_kernels_enabled():
        return "ZENEDGE_NATIVE_KERNELS=0"
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "no /proc/cpuinfo to check the CPU's features"
    missing = [flag for flag in CPU_FLAGS if flag not in flags]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    if _compiler() is None:
        return "no C compiler (set CC, or install gcc)"
    return None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")


def _build_and_open():
    compiler = _compiler()
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join((compiler, *FLAGS)).encode()).hexdigest()[:16]
    target = paths.kernel_cache() / f"int4_gemv-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".build-", suffix=".so")
        os.close(fd)
        try:
            subprocess.run([compiler, *FLAGS, "-o", partial, str(SOURCE)], check=True, capture_output=True,
                           text=True, timeout=120)
            os.replace(partial, target)
        except subprocess.CalledProcessError as exc:
            raise subprocess.SubprocessError(exc.stderr or str(exc)) from None
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    function = ctypes.CDLL(str(target)).zenedge_int4_gemm
    function.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3
    function.restype = ctypes.c_int
    return function


def _self_test(function) -> bool:
    """The kernel against torch on a small random weight (odd row count: the one-row tail too)."""
    g = torch.Generator().manual_seed(0)
    rows, inputs = 37, 128
    q = torch.randint(0, 16, (rows, inputs), generator=g, dtype=torch.uint8)
    scale = torch.rand(rows, inputs // 32, generator=g) * 0.1
    zero = torch.randn(rows, inputs // 32, generator=g) * 0.1
    x = torch.randn(3, inputs, generator=g)
    blocks = q.view(rows, inputs // 64, 2, 32)
    codes = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(rows, inputs // 2).contiguous()
    scale, zero = scale.to(torch.bfloat16), zero.to(torch.bfloat16)
    y = torch.empty(3, rows)
    if function(x.data_ptr(), codes.data_ptr(), scale.data_ptr(), zero.data_ptr(), y.data_ptr(), 3, rows, inputs):
        return False
    weight = ((q.float().view(rows, -1, 32) - 8) * scale.float()[..., None] + zero.float()[..., None]).view(rows, inputs)
    expected = x.bfloat16().float() @ weight.t()
    return bool(torch.allclose(y, expected, rtol=1e-4, atol=1e-4))
