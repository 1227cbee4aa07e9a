"""A/B of two builds of zenedge's CPU kernels on the same weights, 2026-12-02 (issue [O]): one process,
interleaved rounds, medians, and the largest difference between the two builds' outputs.

    python benchmarks/2026-12-02-kernel-ab.py MODE A.so B.so

A.so and B.so are the libraries `zenedge.kernels.native` builds from two commits' kernels/native
(named cpu-kernels-<hash>.so in the user cache directory). MODE:

- int4-layout: A takes W in rows (kernels/native at 8f664f1), B in 16-row blocks (7b87fc5);
- int4: both in 16-row blocks (one chain of dot products per row at a0fc554, two at 9851aae);
- head-layout: the Q8_0 head, A in rows (7b87fc5), B in 16-row blocks (a0fc554);
- head: both in 16-row blocks (a0fc554 against 9851aae);
- signs: the packed 1-bit sign product, y += α ⊙ (S·x), on the same 30 layers' shapes.

Issue [P] used int4, head and signs to compare the AVX-512 build before and after lanes.h
(395efba against 5c4215a), and two AVX2 builds (5ba3f85 against 5c4215a: one row of sign masks for
four rows of x; the head's codes from two 8-byte loads). "max |diff|" 0 means the same bits.

int4: a SmolLM2-135M's worth of decoder shapes (30 layers), random, in 2 MB pages; head: 49152 × 576.
The outputs are in benchmarks/2026-12-02-kernel-ab.txt.
"""
import ctypes
import statistics
import sys
import time

import torch

from zenedge.kernels import native
from zenedge.runtime.cpu_weights import _huge_pages, _int4_quantized

LAYERS = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30
HEAD = (49152, 576)


def in_huge_pages(tensors):
    sizes = [-(-t.numel() * t.element_size() // 64) * 64 for t in tensors]
    block, at, out = _huge_pages(sum(sizes)), 0, []
    for t, size in zip(tensors, sizes):
        moved = block[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        moved.copy_(t)
        out.append(moved)
        at += size
    return out


def int4_weights(blocks: bool):
    """[(codes, scale, zero, rows, inputs)] in rows (the old layout) or in 16-row blocks."""
    torch.manual_seed(0)
    made = []
    for rows, inputs in LAYERS:
        q, s, z = _int4_quantized(torch.randn(rows, inputs) * 0.02, 32)
        if blocks:
            made.append((*native.int4_layout(q, s, z), rows, inputs))
        else:
            halves = q.to(torch.uint8).view(rows, inputs // 64, 2, 32)
            made.append(((halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(rows, inputs // 2).contiguous(),
                         s.contiguous(), z.contiguous(), rows, inputs))
    moved = in_huge_pages([t for w in made for t in w[:3]])
    return [(*moved[3 * k:3 * k + 3], w[3], w[4]) for k, w in enumerate(made)]


def head_weights(blocks: bool):
    torch.manual_seed(0)
    rows, inputs = HEAD
    codes = torch.randint(-127, 128, (rows, inputs), dtype=torch.int8)
    scale = (torch.rand(rows, inputs // 32) * 1e-3).half()
    return [(*(native.int8_layout(codes, scale) if blocks else (codes, scale)), rows, inputs)]


def sign_weights(blocks: bool):
    torch.manual_seed(0)
    return [(torch.randint(0, 256, (rows, inputs // 8), dtype=torch.uint8), torch.rand(rows) * 0.01, rows, inputs)
            for rows, inputs in LAYERS]


def timed(call, weights, rows_of_x, xs, ys) -> float:
    start = time.perf_counter()
    for (*tensors, rows, inputs), y in zip(weights, ys):
        call(xs[inputs].data_ptr(), *(t.data_ptr() for t in tensors), y.data_ptr(), rows_of_x, rows, inputs)
    return time.perf_counter() - start


def main(mode: str, a_path: str, b_path: str) -> None:
    head, signs = mode.startswith("head"), mode == "signs"
    name, pointers = ("zenedge_int8_gemm", 4) if head else ("zenedge_sign_add", 4) if signs else ("zenedge_int4_gemm", 5)
    calls = []
    for path in (a_path, b_path):
        function = getattr(ctypes.CDLL(path), name)
        function.argtypes = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * (5 if signs else 3)
        if signs:   # (x, signs, alpha, y, M, K, N, ldx, ldy), y zeroed: it adds into y
            calls.append(lambda x, s, a, y, m, n, k, f=function: f(x, s, a, y, m, k, n, k, n))
        else:
            calls.append(function)
    make = head_weights if head else sign_weights if signs else int4_weights
    weights = (make(not mode.endswith("layout")), make(True))
    for rows_of_x in (1, 2, 4, 8, 16):
        xs = {inputs: torch.randn(rows_of_x, inputs) for inputs in {w[-1] for w in weights[0]}}
        ys = [[torch.zeros(rows_of_x, w[-2]) for w in weights[0]] for _ in range(2)]
        times = ([], [])
        for _ in range(15):
            for side in (0, 1):
                times[side].append(timed(calls[side], weights[side], rows_of_x, xs, ys[side]))
        a, b = (statistics.median(t) for t in times)
        diff = max((p - q).abs().max().item() for p, q in zip(*ys))
        print(f"M={rows_of_x:2d} A {1e3 * a:6.2f} ms  B {1e3 * b:6.2f} ms  B/A {b / a:.2f}  max |diff| {diff:.1e}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
