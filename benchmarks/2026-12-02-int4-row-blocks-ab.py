"""A/B of zenedge's int4 kernel, 2026-12-02 (issue [O]): the kernel before (rows of W, 64-input
slices, one horizontal sum per (W row, x row); kernels/native at commit 8f664f1) against the 16-row
blocks (one W row per vector lane; 7b87fc5), on the same int4 weights (a SmolLM2-135M's worth of
decoder shapes, random), each in its own layout in 2 MB pages, one process, 15 interleaved rounds,
medians. Usage: python benchmarks/2026-12-02-int4-row-blocks-ab.py OLD.so NEW.so, where each .so is
the library `zenedge.kernels.native` builds from that commit's kernels/native (it names it
cpu-kernels-<hash>.so in the user cache directory). Output: benchmarks/2026-12-02-int4-row-blocks-ab.txt.
"""
import ctypes, statistics, sys, time, torch
from zenedge.kernels import native
from zenedge.runtime.cpu_weights import _int4_quantized, _huge_pages
torch.manual_seed(0)
old, new = (ctypes.CDLL(p) for p in sys.argv[1:3])
for l in (old, new):
    l.zenedge_int4_gemm.argtypes = [ctypes.c_void_p]*5 + [ctypes.c_int64]*3
shapes = [(960,576),(576,576),(3072,576),(576,1536)]*30
def huge(ts):
    total = sum(-(-t.numel()*t.element_size()//64)*64 for t in ts); block = _huge_pages(total); out=[]; at=0
    for t in ts:
        n=t.numel()*t.element_size(); m=block[at:at+n].view(t.dtype).view(t.shape); m.copy_(t); out.append(m); at += -(-n//64)*64
    return out
W_old, W_new = [], []
for o, i in shapes:
    q, s, z = _int4_quantized(torch.randn(o, i) * 0.02, 32)
    h = q.to(torch.uint8).view(o, i // 64, 2, 32)
    W_old.append(((h[:, :, 0] | (h[:, :, 1] << 4)).reshape(o, i // 2).contiguous(), s.contiguous(), z.contiguous(), o, i))
    c, bs, bz = native.int4_layout(q, s, z)
    W_new.append((c, bs, bz, o, i))
flat_old = huge([t for w in W_old for t in w[:3]]); flat_new = huge([t for w in W_new for t in w[:3]])
W_old = [(*flat_old[3*k:3*k+3], w[3], w[4]) for k, w in enumerate(W_old)]
W_new = [(*flat_new[3*k:3*k+3], w[3], w[4]) for k, w in enumerate(W_new)]
def run(lib, W, M, xs, ys):
    t = time.perf_counter()
    for (c, s, z, o, i), y in zip(W, ys):
        lib.zenedge_int4_gemm(xs[i].data_ptr(), c.data_ptr(), s.data_ptr(), z.data_ptr(), y.data_ptr(), M, o, i)
    return time.perf_counter() - t
for M in (1, 2, 4, 8, 16):
    xs = {i: torch.randn(M, i) for i in (576, 1536)}
    y1 = [torch.empty(M, o) for o, i in shapes]; y2 = [torch.empty(M, o) for o, i in shapes]
    a, b = [], []
    for _ in range(15):
        a.append(run(old, W_old, M, xs, y1)); b.append(run(new, W_new, M, xs, y2))
    diff = max((p - q).abs().max().item() for p, q in zip(y1, y2))
    print(f"M={M:2d} old {1e3*statistics.median(a):6.2f} ms  new {1e3*statistics.median(b):6.2f} ms  "
          f"new/old {statistics.median(b)/statistics.median(a):.2f}  max |diff| {diff:.2e}")
