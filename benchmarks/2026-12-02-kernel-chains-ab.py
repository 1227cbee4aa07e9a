"""Two chains of dot products per row against one, 2026-12-02 (issue [O]): libraries built from
kernels/native before (one chain per row: b4f449fe… in the output, commit of the int8 head change)
and after (int4: the low and the high nibbles' chains; the head: even and odd inputs), on the same
16-row-block weights, one process, 15 interleaved rounds, medians. Usage: python
benchmarks/2026-12-02-kernel-chains-ab.py int4|head A.so B.so. Output: the .txt beside.
"""
import sys
MODE = sys.argv.pop(1)
if MODE == "int4":
    import ctypes, statistics, sys, time, torch
    from zenedge.kernels import native
    from zenedge.runtime.cpu_weights import _int4_quantized, _huge_pages
    torch.manual_seed(0)
    libs = [ctypes.CDLL(p) for p in sys.argv[1:3]]
    for l in libs:
        l.zenedge_int4_gemm.argtypes = [ctypes.c_void_p]*5 + [ctypes.c_int64]*3
    shapes = [(960,576),(576,576),(3072,576),(576,1536)]*30
    W = []
    ts = []
    for o, i in shapes:
        q, s, z = _int4_quantized(torch.randn(o, i) * 0.02, 32)
        c, bs, bz = native.int4_layout(q, s, z); W.append((o, i)); ts += [c, bs, bz]
    total = sum(-(-t.numel()*t.element_size()//64)*64 for t in ts); block = _huge_pages(total); at = 0; moved = []
    for t in ts:
        n = t.numel()*t.element_size(); m = block[at:at+n].view(t.dtype).view(t.shape); m.copy_(t); moved.append(m); at += -(-n//64)*64
    def run(lib, M, xs, ys):
        t = time.perf_counter()
        for k, ((o, i), y) in enumerate(zip(W, ys)):
            c, s, z = moved[3*k:3*k+3]
            lib.zenedge_int4_gemm(xs[i].data_ptr(), c.data_ptr(), s.data_ptr(), z.data_ptr(), y.data_ptr(), M, o, i)
        return time.perf_counter() - t
    for M in (1, 2, 4, 8, 16):
        xs = {i: torch.randn(M, i) for i in (576, 1536)}
        y1 = [torch.empty(M, o) for o, i in W]; y2 = [torch.empty(M, o) for o, i in W]
        a, b = [], []
        for _ in range(15):
            a.append(run(libs[0], M, xs, y1)); b.append(run(libs[1], M, xs, y2))
        print(f"M={M:2d} A {1e3*statistics.median(a):6.2f} ms  B {1e3*statistics.median(b):6.2f} ms  B/A {statistics.median(b)/statistics.median(a):.2f}  max |diff| {max((p-q).abs().max().item() for p,q in zip(y1,y2)):.1e}")
else:
    import ctypes, statistics, sys, time, torch
    from zenedge.kernels import native
    torch.manual_seed(0)
    libs = [ctypes.CDLL(p) for p in sys.argv[1:3]]
    for l in libs:
        l.zenedge_int8_gemm.argtypes = [ctypes.c_void_p]*4 + [ctypes.c_int64]*3
    N, K = 49152, 576
    codes = torch.randint(-127, 128, (N, K), dtype=torch.int8); scale = (torch.rand(N, K // 32) * 1e-3).half()
    bc, bs = native.int8_layout(codes, scale)
    for M in (1, 2, 4, 8, 16):
        x = torch.randn(M, K); y1 = torch.empty(M, N); y2 = torch.empty(M, N)
        a, b = [], []
        for _ in range(15):
            t = time.perf_counter(); libs[0].zenedge_int8_gemm(x.data_ptr(), bc.data_ptr(), bs.data_ptr(), y1.data_ptr(), M, N, K); a.append(time.perf_counter() - t)
            t = time.perf_counter(); libs[1].zenedge_int8_gemm(x.data_ptr(), bc.data_ptr(), bs.data_ptr(), y2.data_ptr(), M, N, K); b.append(time.perf_counter() - t)
        print(f"M={M:2d} A {1e3*statistics.median(a):6.2f} ms  B {1e3*statistics.median(b):6.2f} ms  B/A {statistics.median(b)/statistics.median(a):.2f}  max |diff| {(y1-y2).abs().max().item():.1e}")
