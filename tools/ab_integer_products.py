"""A/B of the int4 and sign kernels: bf16 activations and fp32 FMAs (the sources at a git commit)
against integer products (the working tree: int16 x for int4 W, int8 x for the signs), AVX2
builds, in one process, on random weights of the default base's shapes (30 layers). Run from the
repository root: python -m tools.ab_integer_products [COMMIT] (default cc8509a, the last commit
with bf16 activations). Prints ms per call, best of 9."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from zenedge.kernels import native

FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-shared", "-fPIC", *native.ISA_FLAGS["avx2"]]
P, I = ctypes.c_void_p, ctypes.c_int64
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]                  # q/k/v, o, gate/up, down
SIGN_SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


def build(sources: dict[str, str], source: str, work: Path, name: str):
    for file, text in sources.items():
        (work / file).write_text(text)
    subprocess.run(["cc", *FLAGS, f"-I{work}", "-o", str(work / name), str(work / source), "-lm"], check=True)
    return ctypes.CDLL(str(work / name))


def old_int4_layout(q, scale, zero):
    """int4_gemv.c's layout before int8 activations: codes [N/16, K/4, 32]."""
    rows, inputs = q.shape
    blocks = q.to(torch.uint8).view(rows // 16, 16, inputs // 4, 4).transpose(1, 2)
    codes = torch.stack((blocks[..., 0] | (blocks[..., 2] << 4), blocks[..., 1] | (blocks[..., 3] << 4)), -1)
    per_block = [t.view(rows // 16, 16, -1).transpose(1, 2).contiguous() for t in (scale, zero)]
    return codes.reshape(rows // 16, inputs // 4, 32).contiguous(), *per_block


def best(fn, rounds=9):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main(commit: str = "cc8509a") -> None:
    here = Path(native.__file__).parent
    old = {f: subprocess.run(["git", "show", f"{commit}:kernels/native/{f}"], check=True, capture_output=True,
                             text=True).stdout for f in ("lanes.h", "int4_gemv.c", "sign_add.c")}
    new = {f: (here / f).read_text() for f in ("lanes.h", "x_rows.h", "int4_gemv.c", "sign_add.c")}
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        libs = {"bf16 x": (build(old, "int4_gemv.c", Path(a), "int4.so"), build(old, "sign_add.c", Path(a), "sign.so")),
                "integer": (build(new, "int4_gemv.c", Path(b), "int4.so"), build(new, "sign_add.c", Path(b), "sign.so"))}
        torch.manual_seed(0)
        weights = []
        for n, k in SHAPES:
            q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
            scale, zero = (torch.rand(n, k // 32) * 0.02).bfloat16(), (torch.randn(n, k // 32) * 0.01).bfloat16()
            weights.append((n, k, {"bf16 x": old_int4_layout(q, scale, zero), "integer": native.int4_layout(q, scale, zero)}))
        signs = [(n, k, torch.randint(0, 256, (n, k // 8), dtype=torch.uint8), torch.rand(n) * 0.01)
                 for n, k in SIGN_SHAPES]
        print(f"ms per call over 30 layers, best of 9; bf16 x: {commit}'s sources, integer: the working tree (AVX2 builds)")
        for m in (1, 2, 4, 8, 16):
            xs = {k: torch.randn(m, k) for k in (576, 1536)}
            ys = {n: torch.zeros(m, n) for n in (192, 576, 960, 1536, 3072)}
            row = {}
            for label, (int4, sign) in libs.items():
                int4.zenedge_int4_gemm.argtypes = [P] * 5 + [I] * 3
                sign.zenedge_sign_add.argtypes = [P] * 4 + [I] * 5

                def products(int4=int4, label=label):
                    for _ in range(30):
                        for n, k, layouts in weights:
                            c, s, z = layouts[label]
                            int4.zenedge_int4_gemm(xs[k].data_ptr(), c.data_ptr(), s.data_ptr(), z.data_ptr(),
                                                   ys[n].data_ptr(), m, n, k)

                def sign_products(sign=sign):
                    for _ in range(30):
                        for n, k, packed, alpha in signs:
                            sign.zenedge_sign_add(xs[k].data_ptr(), packed.data_ptr(), alpha.data_ptr(),
                                                  ys[n].data_ptr(), m, k, n, k, n)
                row[label] = (best(products), best(sign_products))
            (i_old, s_old), (i_new, s_new) = row["bf16 x"], row["integer"]
            print(f"{m:2d} rows: int4 {i_old:6.2f} → {i_new:6.2f} ms ({i_new / i_old:.2f}×)   "
                  f"signs {s_old:6.2f} → {s_new:6.2f} ms ({s_new / s_old:.2f}×)")


if __name__ == "__main__":
    main(*sys.argv[1:])
