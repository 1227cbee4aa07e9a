"""Every instruction set's build of the C kernels against the scalar reference, bit for bit.

lanes.h and the kernels are written so that AVX-512 (with VNNI or not), AVX2, NEON and the
portable scalar build round alike: a request decodes the same tokens on any laptop as on a server.
Each build this CPU runs is compared here on every kernel; ARM64 NEON is compared under qemu (test_neon.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import run_cli
from zenedge.kernels import native

pytestmark = pytest.mark.skipif(native.paths.c_compiler() is None, reason="no C compiler")


def outputs(lib) -> dict[str, torch.Tensor]:
    """Each kernel's output on fixed random inputs, with shapes that take every tail and tile size."""
    g = torch.Generator().manual_seed(7)
    found = {}
    rows, inputs = 48, 192                            # int4: 3 blocks, 6 groups
    q = torch.randint(0, 16, (rows, inputs), generator=g, dtype=torch.uint8)
    scale = (torch.rand(rows, inputs // 32, generator=g) * 0.1).bfloat16()
    zero = (torch.randn(rows, inputs // 32, generator=g) * 0.1).bfloat16()
    codes, block_scale, block_zero = native.int4_layout(q, scale, zero)
    for m in (1, 3, 8, 13):                           # tiles of 4, and their remainders
        x = torch.randn(m, inputs, generator=g) * 3
        y = torch.empty(m, rows)
        assert lib.zenedge_int4_gemm(x.data_ptr(), codes.data_ptr(), block_scale.data_ptr(), block_zero.data_ptr(),
                                     y.data_ptr(), m, rows, inputs) == 0
        found[f"int4 {m}"] = y
        y = torch.empty(m, rows)
        assert lib.zenedge_int4_gemm_x8(x.data_ptr(), codes.data_ptr(), block_scale.data_ptr(), block_zero.data_ptr(),
                                        y.data_ptr(), m, rows, inputs, 0) == 0
        found[f"int4 x8 {m}"] = y
    for dtype in (torch.float16, torch.float32):      # a GGUF file's scales: W = q·s + m
        codes, block_scale, block_zero = native.int4_layout(q, scale.to(dtype), zero.to(dtype))
        for m in (1, 6):
            x = torch.randn(m, inputs, generator=g) * 3
            y = torch.empty(m, rows)
            assert lib.zenedge_int4_gemm_scaled(x.data_ptr(), codes.data_ptr(), block_scale.data_ptr(),
                                                block_zero.data_ptr(), y.data_ptr(), m, rows, inputs,
                                                native.SCALE_KINDS[dtype]) == 0
            found[f"int4 {dtype} {m}"] = y
            y = torch.empty(m, rows)
            assert lib.zenedge_int4_gemm_x8(x.data_ptr(), codes.data_ptr(), block_scale.data_ptr(),
                                            block_zero.data_ptr(), y.data_ptr(), m, rows, inputs,
                                            native.SCALE_KINDS[dtype]) == 0
            found[f"int4 x8 {dtype} {m}"] = y
    rows8 = 37                                        # a partial last block
    codes8 = torch.randint(-127, 128, (rows8, 96), generator=g, dtype=torch.int8)
    scale8 = (torch.rand(rows8, 3, generator=g) * 0.01).half()
    block_codes, block_scale8 = native.int8_layout(codes8, scale8)
    for m in (1, 5, 9):
        x = torch.randn(m, 96, generator=g)
        y = torch.empty(m, rows8)
        assert lib.zenedge_int8_gemm(x.data_ptr(), block_codes.data_ptr(), block_scale8.data_ptr(), y.data_ptr(), m,
                                     rows8, 96) == 0
        found[f"int8 {m}"] = y
    x, w = torch.randn(3, 100, generator=g), torch.randn(100, generator=g)
    y = torch.empty_like(x)
    lib.zenedge_rms_norm(x.data_ptr(), w.data_ptr(), y.data_ptr(), 3, 100, 1e-5)
    found["rms_norm"] = y
    q_att = torch.randn(2, 6, 32, generator=g)
    cache = torch.randn(2, 2, 2, 40, 32, generator=g) * 2
    keys, values, lengths = cache[0, :, :, :37], cache[1, :, :, :37], torch.tensor([21, 37])
    out = torch.empty_like(q_att)
    assert lib.zenedge_decode_attention(q_att.data_ptr(), keys.data_ptr(), values.data_ptr(), lengths.data_ptr(),
                                        out.data_ptr(), 2, 6, 2, 37, 32, q_att.stride(0), keys.stride(0),
                                        keys.stride(1), 0.3) == 0
    found["attention"] = out
    x, a, b_t = torch.randn(3, 40, generator=g), torch.randn(5, 40, generator=g), torch.randn(5, 37, generator=g)
    y = torch.randn(3, 37, generator=g)
    assert lib.zenedge_lora_add(x.data_ptr(), a.data_ptr(), b_t.data_ptr(), y.data_ptr(), 3, 40, 37, 5, 40, 37, 0.5) == 0
    found["lora"] = y
    packed = torch.randint(0, 256, (20, 37), generator=g, dtype=torch.uint8)   # [K/8, N]: 32 rows and 5 more
    alpha = torch.rand(37, generator=g) * 0.01
    for m in (1, 2, 5):
        x, y = torch.randn(m, 160, generator=g), torch.randn(m, 37, generator=g)
        assert lib.zenedge_sign_add(x.data_ptr(), packed.data_ptr(), alpha.data_ptr(), y.data_ptr(), m, 160, 37, 160,
                                    37) == 0
        found[f"signs {m}"] = y
    weight = torch.randn(37, 160, generator=g) * 0.1
    dense = torch.empty(30, 160)
    assert lib.zenedge_sign_dense(weight.data_ptr(), packed.data_ptr(), alpha.data_ptr(), dense.data_ptr(), 7, 37, 160,
                                  37, 160) == 0
    found["sign_dense"] = dense
    gu = torch.randn(3, 2 * 40, generator=g) * 6
    gu[0, :4] = torch.tensor([-100.0, -87.5, 0.0, -0.0])   # e^x's cut-off, and both zeros
    out = torch.empty(3, 40)
    lib.zenedge_silu_mul(gu.data_ptr(), out.data_ptr(), 3, 40)
    found["silu_mul"] = out
    return found


@pytest.fixture(scope="module")
def reference():
    return outputs(native.build("scalar"))


@pytest.mark.parametrize("isa", [name for name in native.PREFERENCE])
def test_each_instruction_set_gives_the_scalar_references_bits(isa, reference):
    if isa not in native.runnable_isas():
        pytest.skip(f"this CPU does not run {isa}")
    lib = native.build(isa)
    failed = [name for name, test in native._SELF_TESTS.items() if not test(lib)]
    assert not failed, f"{isa}: {failed} disagree with torch"
    got = outputs(lib)
    for name, want in reference.items():
        assert torch.equal(got[name], want), f"{isa} {name}: max |Δ| {(got[name] - want).abs().max().item()}"


def test_the_scalar_reference_agrees_with_torch(reference):
    """The reference itself is right: the same sums as torch's ops, to rounding."""
    lib = native.build("scalar")
    assert all(test(lib) for test in native._SELF_TESTS.values())
    assert torch.isfinite(torch.cat([t.flatten() for t in reference.values()])).all()


def _in_process(code: str, isa: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from zenedge.kernels import native\n" + code],
                          env={**os.environ, "ZENEDGE_CPU_ISA": isa, "ZENEDGE_NATIVE_KERNELS": "1"},
                          capture_output=True, text=True, timeout=300)


def test_the_best_instruction_set_this_cpu_runs_is_chosen():
    out = subprocess.run([sys.executable, "-c", "from zenedge.kernels import native; print(*native.isa(), sep='|')"],
                         env={k: v for k, v in os.environ.items() if k != "ZENEDGE_CPU_ISA"}, capture_output=True,
                         text=True, check=True).stdout.strip()
    best = native.runnable_isas()[0]
    if best == "scalar":
        assert out.startswith("None|")
    else:
        assert out.startswith(f"{best}|the CPU has {', '.join(native.ISA_NEEDS[best])}")


def test_an_instruction_set_can_be_forced_and_is_reported():
    if "avx2" not in native.runnable_isas():
        pytest.skip("this CPU does not run avx2")
    out = _in_process("print(*native.isa(), sep='|'); print(native.library() is not None)", "avx2")
    assert out.stdout.split() == ["avx2|ZENEDGE_CPU_ISA=avx2", "True"], out.stderr
    out = _in_process("print(native.library(), native.off_reason())", "off")
    assert out.stdout.strip() == "None ZENEDGE_CPU_ISA=off"


def test_an_instruction_set_this_cpu_cannot_run_is_a_one_line_error():
    missing = next((name for name in ("neon", "avx512", "avx2") if name not in native.runnable_isas()), None)
    if missing is None:
        pytest.skip("this CPU runs every instruction set")
    out = _in_process("native.library()", missing)
    assert out.returncode != 0 and f"ConfigError: ZENEDGE_CPU_ISA={missing}, but this CPU does not run it" in out.stderr
    out = _in_process("print(native.off_reason())", missing)     # what doctor and /api/ps show
    assert out.stdout.startswith(f"ZENEDGE_CPU_ISA={missing}, but this CPU does not run it (it lacks ")
    out = _in_process("native.library()", "sse9")
    assert "ZENEDGE_CPU_ISA='sse9' is not one of avx512vnni, avx512, avx2, neon, scalar, off" in out.stderr


def test_doctor_names_the_instruction_set(tmp_path):
    if "avx2" not in native.runnable_isas():
        pytest.skip("this CPU does not run avx2")
    result = run_cli("doctor", "--json", env={"ZENEDGE_CPU_ISA": "avx2", "ZENEDGE_NATIVE_KERNELS": "1",
                                              "ZENEDGE_HOME": str(tmp_path / "home"),
                                              "ZENEDGE_CONFIG": str(tmp_path / "config.toml")})
    path = next(r for r in json.loads(result.stdout) if r["check"].startswith("decode path"))
    assert "native kernels on (avx2: ZENEDGE_CPU_ISA=avx2)" in path["detail"], path
