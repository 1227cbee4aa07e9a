"""A/B of the sign kernel (sign_add.c): the sources at a git commit against the working tree, AVX2
builds, in one process. First checks that both give the same bits on odd shapes; then times a
pass over 30 layers' distinct sign matrices of the default base's shapes (13 MB), after a 64 MB
write that pushes them out of the caches (its own time, measured in the same rounds, is taken
off), rounds interleaved, best of 11. Run from the repository root:
python -m tools.ab_sign_tables [COMMIT] (default HEAD)."""
import ctypes, subprocess, sys, tempfile, time
from pathlib import Path
import torch
from zenedge.kernels import native

FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-shared", "-fPIC", *native.ISA_FLAGS[sys.argv[2] if len(sys.argv) > 2 else "avx2"]]
P, I = ctypes.c_void_p, ctypes.c_int64
SIGN_SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
FILES = ("lanes.h", "x_rows.h", "sign_add.c")

def build(sources, work):
    for f, t in sources.items():
        (work / f).write_text(t)
    subprocess.run(["cc", *FLAGS, f"-I{work}", "-o", str(work / "s.so"), str(work / "sign_add.c"), "-lm"], check=True)
    lib = ctypes.CDLL(str(work / "s.so")); lib.zenedge_sign_add.argtypes = [P] * 4 + [I] * 5
    return lib

def best(fn, rounds=9):
    t = []
    for _ in range(rounds):
        s = time.perf_counter(); fn(); t.append(time.perf_counter() - s)
    return min(t) * 1e3

commit = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
here = Path(native.__file__).parent
old = {f: subprocess.run(["git", "show", f"{commit}:kernels/native/{f}"], check=True, capture_output=True, text=True).stdout for f in FILES}
new = {f: (here / f).read_text() for f in FILES}
with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
    libs = {"old": build(old, Path(a)), "new": build(new, Path(b))}
    torch.manual_seed(0)
    # correctness: odd shapes
    for n, k, m in [(40, 96, 3), (33, 32, 1), (64, 160, 5), (576, 576, 16), (1, 64, 2), (95, 544, 7), (32, 128, 17)]:
        packed = torch.randint(0, 256, (n, k // 8), dtype=torch.uint8); alpha = torch.rand(n) * 0.01
        x = torch.randn(m, k) * torch.rand(m, k) * 4
        x[0, 3] = 40.0
        outs = []
        y0 = torch.randn(m, n)
        for label, lib in libs.items():
            y = y0.clone()
            signs_in = packed.t().contiguous() if label == "new" else packed   # the working tree reads [K/8, N]
            assert lib.zenedge_sign_add(x.data_ptr(), signs_in.data_ptr(), alpha.data_ptr(), y.data_ptr(), m, k, n, k, n) == 0
            outs.append(y)
        assert torch.equal(outs[0], outs[1]), (n, k, m, (outs[0] - outs[1]).abs().max())
    print("bits equal on odd shapes")
    signs = [(n, k, torch.randint(0, 256, (n, k // 8), dtype=torch.uint8), torch.rand(n) * 0.01) for _ in range(30) for n, k in SIGN_SHAPES]
    by_input = [(n, k, packed.t().contiguous(), alpha) for n, k, packed, alpha in signs]
    flush = torch.zeros(64 << 20, dtype=torch.uint8)
    print(f"ms per pass over 30 distinct layers' signs (13 MB, a 64 MB write before each pass, its time taken off), interleaved rounds, best of 11; old: {commit}, new: working tree")
    for m in (1, 2, 4, 8, 16):
        xs = {k: torch.randn(m, k) for k in (576, 1536)}
        ys = {n: torch.zeros(m, n) for n in (192, 576, 1536)}
        times = {"old": [], "new": [], "flush": []}
        for _ in range(11):
            for label in ("old", "new", "flush"):
                start = time.perf_counter()
                flush.add_(1)
                if label != "flush":
                    lib = libs[label]
                    for n, k, packed, alpha in (by_input if label == "new" else signs):
                        lib.zenedge_sign_add(xs[k].data_ptr(), packed.data_ptr(), alpha.data_ptr(), ys[n].data_ptr(), m, k, n, k, n)
                times[label].append(time.perf_counter() - start)
        f = min(times["flush"])
        o, nw = (1e3 * (min(times[l]) - f) for l in ("old", "new"))
        print(f"{m:2d} rows: signs {o:6.2f} → {nw:6.2f} ms ({nw / o:.2f}×)")
