"""The int4 kernel's products at 1.7B shapes, 256 rows of x (a scoring batch or a prefill), on each
instruction-set build this CPU runs, with x rounded to int16 (zenedge_int4_gemm_scaled) and to
int8 (zenedge_int4_gemm_x8); GFLOP/s on one thread and each ratio to avx512's int16 in this run.

    python benchmarks/2026-12-07-int4-activations-probe.py
"""
import time

import torch

from zenedge.kernels import native
from zenedge.runtime.cpu_weights import NativeInt4Weight

ROWS = 256
torch.manual_seed(0)
torch.set_num_threads(1)
shapes = ((2048, 2048), (8192, 2048), (2048, 8192))     # q/o, gate/up, down of SmolLM2-1.7B
weights = {shape: NativeInt4Weight(torch.randn(*shape) * 0.02) for shape in shapes}
xs = {shape: torch.randn(ROWS, shape[1]) for shape in shapes}
rates = {}
for rounds in range(2):                                  # interleaved: a second pass over every build
    for isa in [name for name in native.runnable_isas() if name != "scalar"]:
        lib = native.build(isa)
        for bits, kernel in ((16, lib.zenedge_int4_gemm_scaled), (8, lib.zenedge_int4_gemm_x8)):
            flops, seconds = 0.0, 0.0
            for shape in shapes:
                w, x = weights[shape], xs[shape]
                y = torch.empty(ROWS, shape[0])
                args = (x.data_ptr(), w.codes.data_ptr(), w.scale.data_ptr(), w.zero.data_ptr(), y.data_ptr(),
                        ROWS, shape[0], shape[1], w.kind)
                kernel(*args)
                start = time.perf_counter()
                for _ in range(3):
                    kernel(*args)
                seconds += time.perf_counter() - start
                flops += 3 * 2 * ROWS * shape[0] * shape[1]
            rates.setdefault((isa, bits), []).append(flops / seconds / 1e9)
base = max(rates[("avx512", 16)]) if ("avx512", 16) in rates else None
for (isa, bits), values in rates.items():
    best = max(values)
    ratio = f"{best / base:.2f}x" if base else "-"
    print(f"{isa:>10} int{bits:<2}  {best:6.1f} GFLOP/s  {ratio} avx512 int16")
