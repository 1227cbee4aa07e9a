"""zenedge's C kernels for the CPU against torch's ops, one thread, in one run:
`python -m tools.cpu_kernels [--rounds 15] [--json PATH]`.

- int4 products streamed over a model's worth of weights (SmolLM2-135M's 30 layers of q/k/v,
  o, gate/up and down, in model order: what a decode step reads, too much for the caches), and
  one 1536×576 weight at 1, 2, 4 and 32 rows of x;
- RMSNorm of one 576-wide row; one-query attention (9 query heads over 3 KV heads of 64) at
  64, 540 and 2000 cached positions, against SDPA;
- each instruction set's build this CPU runs (`--isas`: AVX-512, AVX2; the scalar reference is
  for correctness, not a contender), against the best: the streamed int4 products and the packed 1-bit sign products at 1, 4 and 16
  rows, and the Q8_0 head (49152 × 576) at one row.

Random weights (the kernels' speed does not depend on the values); best of `rounds` for each,
the contenders interleaved round by round so a noisy neighbour hits both. Prints ratios.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import torch.nn.functional as F

# (rows, inputs) of one SmolLM2-135M layer's products as the decode step calls them
LAYER = ((960, 576), (576, 576), (3072, 576), (576, 1536))
LAYERS = 30


def _best(contenders: dict, rounds: int, calls: int) -> dict:
    """Best time per call (µs) of each contender (a no-argument function), interleaved by round."""
    best = {name: float("inf") for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return best


def run(rounds: int = 15) -> dict:
    from zenedge.kernels import native
    from zenedge.runtime.cpu_weights import Int4Weight, NativeInt4Weight

    if native.library() is None:
        raise SystemExit("the native CPU kernels are not available here (see the log for why)")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    results: dict = {"date": datetime.date.today().isoformat(), "threads": 1, "rounds": rounds}

    weights = [torch.randn(shape, generator=g) * 0.02 for _ in range(LAYERS) for shape in LAYER]
    inputs = {k: torch.randn(1, k, generator=g) for k in {k for _, k in LAYER}}
    calls = {kind: [(make(w), inputs[w.shape[1]]) for w in weights]
             for kind, make in (("torch int4", Int4Weight), ("zenedge int4", NativeInt4Weight))}

    def stream(kind):
        return lambda: [copy._matmul(x) for copy, x in calls[kind]]
    with torch.inference_mode():
        best = _best({kind: stream(kind) for kind in calls}, rounds, 1)
        nbytes = sum(copy.nbytes for copy, _ in calls["zenedge int4"])
        results["int4_streamed"] = {"bytes": nbytes, **{f"{kind} ms": t / 1e3 for kind, t in best.items()},
                                    "ratio": best["torch int4"] / best["zenedge int4"]}

        one = torch.randn(1536, 576, generator=g) * 0.02
        theirs, ours = Int4Weight(one), NativeInt4Weight(one)
        results["int4_rows"] = {}
        for rows in (1, 2, 4, 32):
            x = torch.randn(rows, 576, generator=g)
            best = _best({"torch": lambda: theirs._matmul(x), "zenedge": lambda: ours._matmul(x)}, rounds, 50)
            results["int4_rows"][rows] = {"torch µs": best["torch"], "zenedge µs": best["zenedge"],
                                          "ratio": best["torch"] / best["zenedge"]}

        weight, row = torch.randn(576, generator=g), torch.randn(1, 576, generator=g)
        norm = native.rms_norm_fn(weight, 1e-5)
        best = _best({"torch": lambda: F.rms_norm(row, (576,), weight, 1e-5), "zenedge": lambda: norm(row)},
                     rounds, 500)
        results["rms_norm_576"] = {"torch µs": best["torch"], "zenedge µs": best["zenedge"],
                                   "ratio": best["torch"] / best["zenedge"]}

        attend = native.decode_attention_fn(9, 3, 64, 0.125, torch.float32, "cpu")
        results["decode_attention"] = {}
        for length in (64, 540, 2000):
            cache = torch.randn(2, 1, 3, 2048, 64, generator=g)
            keys, values = cache[0, :, :, :length], cache[1, :, :, :length]
            q, mask = torch.randn(1, 9, 64, generator=g), torch.zeros(1, 1, 1, length)

            def sdpa():
                return F.scaled_dot_product_attention(q.view(1, 3, 3, 64), keys, values, attn_mask=mask, scale=0.125)
            lengths = torch.tensor([length])       # each row's length (a mask made the wrapper return None)
            out = attend(q, keys, values, lengths)   # timing a refusal would measure nothing: check it computes
            if out is None or not torch.allclose(out.view(1, 3, 3, 64), sdpa(), rtol=1e-4, atol=1e-5):
                raise RuntimeError(f"the C attention did not compute SDPA's result at {length} positions")
            best = _best({"sdpa": sdpa, "zenedge": lambda: attend(q, keys, values, lengths)}, rounds, 100)
            results["decode_attention"][length] = {"sdpa µs": best["sdpa"], "zenedge µs": best["zenedge"],
                                                   "ratio": best["sdpa"] / best["zenedge"]}
    return results


def instruction_sets(rounds: int = 7, layers: int = LAYERS) -> dict:
    """ms per call of each build this CPU runs (native.build), interleaved by round, and each one's
    time ÷ the first's (the best instruction set)."""
    from zenedge.kernels import native

    g = torch.Generator().manual_seed(0)
    libs = {name: native.build(name) for name in native.runnable_isas() if name != "scalar"}
    shapes = [shape for _ in range(layers) for shape in LAYER]
    int4 = []
    for rows, inputs in shapes:
        q = torch.randint(0, 16, (rows, inputs), generator=g, dtype=torch.uint8)
        scale, zero = (torch.rand(rows, inputs // 32, generator=g) * 0.01).bfloat16(), torch.zeros(rows, inputs // 32).bfloat16()
        int4.append((rows, inputs, *native.int4_layout(q, scale, zero)))
    signs = [(rows, inputs, torch.randint(0, 256, (rows, inputs // 8), generator=g, dtype=torch.uint8),
              torch.rand(rows, generator=g)) for rows, inputs in shapes]
    head_codes, head_scale = native.int8_layout(torch.randint(-127, 128, (49152, 576), generator=g, dtype=torch.int8),
                                                (torch.rand(49152, 18, generator=g) * 0.01).half())

    def int4_stream(lib, m):
        xs = {k: torch.randn(m, k, generator=g) for _, k in LAYER}
        ys = {n: torch.empty(m, n) for n, _ in LAYER}
        return lambda: [lib.zenedge_int4_gemm(xs[k].data_ptr(), c.data_ptr(), s.data_ptr(), z.data_ptr(),
                                              ys[n].data_ptr(), m, n, k) for n, k, c, s, z in int4]

    def sign_stream(lib, m):
        xs = {k: torch.randn(m, k, generator=g) for _, k in LAYER}
        ys = {n: torch.zeros(m, n) for n, _ in LAYER}
        return lambda: [lib.zenedge_sign_add(xs[k].data_ptr(), p.data_ptr(), a.data_ptr(), ys[n].data_ptr(), m, k, n,
                                             k, n) for n, k, p, a in signs]

    def head(lib):
        x, y = torch.randn(1, 576, generator=g), torch.empty(1, 49152)
        return lambda: lib.zenedge_int8_gemm(x.data_ptr(), head_codes.data_ptr(), head_scale.data_ptr(), y.data_ptr(),
                                             1, 49152, 576)
    cases = {**{f"int4, {layers} layers, {m} row(s)": lambda lib, m=m: int4_stream(lib, m) for m in (1, 4, 16)},
             **{f"signs, {layers} layers, {m} row(s)": lambda lib, m=m: sign_stream(lib, m) for m in (1, 4, 16)},
             "Q8_0 head, 1 row": head}
    found = {}
    for case, make in cases.items():
        best = _best({name: make(lib) for name, lib in libs.items()}, rounds, 1)
        first = next(iter(best.values()))
        found[case] = {name: {"ms": t / 1e3, "÷ best": t / first} for name, t in best.items()}
    return found


def report(results: dict) -> str:
    lines = [f"CPU kernels, {results.get('date', '')}, 1 thread"]
    if "int4_streamed" in results:
        s = results["int4_streamed"]
        lines = [f"CPU kernels, {results['date']}, 1 thread, best of {results['rounds']} (ratio = torch / zenedge time)",
                 f"int4, 30 layers streamed ({s['bytes'] / 1e6:.1f} MB): torch {s['torch int4 ms']:.2f} ms, "
                 f"zenedge {s['zenedge int4 ms']:.2f} ms, {s['ratio']:.2f}×"]
        for rows, r in results["int4_rows"].items():
            lines.append(f"int4 1536×576, {rows} row(s) of x: torch {r['torch µs']:.0f} µs, "
                         f"zenedge {r['zenedge µs']:.0f} µs, {r['ratio']:.2f}×")
        r = results["rms_norm_576"]
        lines.append(f"RMSNorm, 576 wide: torch {r['torch µs']:.1f} µs, zenedge {r['zenedge µs']:.1f} µs, {r['ratio']:.2f}×")
        for length, r in results["decode_attention"].items():
            lines.append(f"attention, {length} positions: SDPA {r['sdpa µs']:.1f} µs, zenedge {r['zenedge µs']:.1f} µs, "
                         f"{r['ratio']:.2f}×")
    for case, builds in results.get("instruction_sets", {}).items():
        lines.append(f"{case}: " + ", ".join(f"{name} {r['ms']:.2f} ms ({r['÷ best']:.2f}×)" for name, r in builds.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--isas", action="store_true", help="only compare the instruction sets' builds")
    args = parser.parse_args(argv)
    results = {"date": datetime.date.today().isoformat(), "threads": 1} if args.isas else run(args.rounds)
    torch.set_num_threads(1)
    results["instruction_sets"] = instruction_sets(min(args.rounds, 7))
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
