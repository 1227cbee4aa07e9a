"""A/B of zenedge's int8 (Q8_0) head kernel, 2026-12-02 (issue [O]): rows of W with a horizontal sum
per (W row, x row) (kernels/native at 7b87fc5) against 16-row blocks, one row per lane (the next
commit), on the same codes and scales (49152 × 576, the default base's head), one process, 15
interleaved rounds, medians. Usage: python benchmarks/2026-12-02-int8-head-row-blocks-ab.py OLD.so
NEW.so (the libraries `zenedge.kernels.native` builds from those commits). Output: the .txt beside.
"""
import ctypes, statistics, sys, time, torch
from zenedge.kernels import native
torch.manual_seed(0)
old, new = (ctypes.CDLL(p) for p in sys.argv[1:3])
for l in (old, new):
    l.zenedge_int8_gemm.argtypes = [ctypes.c_void_p]*4 + [ctypes.c_int64]*3
N, K = 49152, 576
codes = torch.randint(-127, 128, (N, K), dtype=torch.int8); scale = (torch.rand(N, K // 32) * 1e-3).half()
bc, bs = native.int8_layout(codes, scale)
for M in (1, 2, 4, 8, 16):
    x = torch.randn(M, K); y1 = torch.empty(M, N); y2 = torch.empty(M, N)
    a, b = [], []
    for _ in range(15):
        t = time.perf_counter(); old.zenedge_int8_gemm(x.data_ptr(), codes.data_ptr(), scale.data_ptr(), y1.data_ptr(), M, N, K); a.append(time.perf_counter() - t)
        t = time.perf_counter(); new.zenedge_int8_gemm(x.data_ptr(), bc.data_ptr(), bs.data_ptr(), y2.data_ptr(), M, N, K); b.append(time.perf_counter() - t)
    print(f"M={M:2d} old {1e3*statistics.median(a):6.2f} ms  new {1e3*statistics.median(b):6.2f} ms  new/old {statistics.median(b)/statistics.median(a):.2f}  max |diff| {(y1-y2).abs().max().item():.1e}")
