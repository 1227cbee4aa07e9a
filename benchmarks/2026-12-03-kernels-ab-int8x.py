import ctypes, time, torch, subprocess
from kernels import native
P, I = ctypes.c_void_p, ctypes.c_int64
def load(p):
    f = ctypes.CDLL(p).zenedge_int4_gemm; f.argtypes = [P]*5 + [I]*3; f.restype = ctypes.c_int; return f
old, new = load("/work/scratch/q8/old_avx2.so"), load("/work/scratch/q8/new_avx2.so")
def old_layout(q, scale, zero):
    rows, inputs = q.shape
    blocks = q.to(torch.uint8).view(rows // 16, 16, inputs // 4, 4).transpose(1, 2)
    codes = torch.stack((blocks[..., 0] | (blocks[..., 2] << 4), blocks[..., 1] | (blocks[..., 3] << 4)), -1)
    per = [t.view(rows // 16, 16, -1).transpose(1, 2).contiguous() for t in (scale, zero)]
    return codes.reshape(rows // 16, inputs // 4, 32).contiguous(), *per
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
ws = []
for N, K in shapes:
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8); scale = (torch.rand(N, K//32)*0.02).bfloat16(); zero = (torch.randn(N, K//32)*0.01).bfloat16()
    ws.append((N, K, old_layout(q, scale, zero), native.int4_layout(q, scale, zero)))
ws = ws * 30
for M in (1, 2, 4, 8, 16):
    xs = {K: torch.randn(M, K) for K in (576, 1536)}; ys = {N: torch.empty(M, N) for N in (960, 576, 3072)}
    def run(f, which):
        for w in ws:
            N, K = w[0], w[1]; c, s, z = w[which]; f(xs[K].data_ptr(), c.data_ptr(), s.data_ptr(), z.data_ptr(), ys[N].data_ptr(), M, N, K)
    best = {}
    for _ in range(9):
        for name, f, which in (("old", old, 2), ("new", new, 3)):
            t = time.perf_counter(); run(f, which); dt = time.perf_counter() - t; best[name] = min(best.get(name, 9), dt)
    print(f"rows {M:2d}: bf16-x kernel {best['old']*1e3:6.2f} ms   int8-x kernel {best['new']*1e3:6.2f} ms   new/old {best['new']/best['old']:.2f}")
