"""Benchmark the BitDelta linear: ``python -m tools.gpu.bitdelta_kernels [--sass | --check | --quick]``.

CUDA: fused kernel vs dense bf16 F.linear on the same shape, vs the naive path (unpack, add,
linear) and vs the published BitDelta design (separate base + delta launches), with achieved
GB/s against a measured device copy bandwidth. All timings come from CUDA-graph replays
(triton.testing.do_bench_cudagraph, median) of R calls that rotate over R weight copies, so
layers that fit in L2 are not timed from L2. Without CUDA: the torch CPU path vs dense linear.
--sass: compile every config for sm_90a (no GPU needed) and print the SASS table.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

GPU_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 8192))     # (out, in)
GPU_ROWS = (1, 16, 256, 2048)
GPU_DELTAS = (1, 8)
CPU_SHAPES = ((576, 576), (1536, 576), (576, 1536), (2048, 2048))
CPU_ROWS = (1, 4, 16, 128)
L2_DEFEAT_BYTES = 160 << 20          # rotate weight copies until one pass exceeds ~3x an H200's L2


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}"


def _say(line: str = "") -> None:
    print(line, flush=True)           # flush: partial tables survive a timeout


# ---- CPU ----------------------------------------------------------------------------------------

def _cpu_time(fn, repeat: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run_cpu() -> None:
    from zenedge.bitdelta.packing import compress

    from zenedge.kernels.bitdelta import cpu

    _say(f"CUDA is absent: CPU path table ({_machine()}, {torch.get_num_threads()} threads, fp32)")
    _say("| out×in | M | dense ms | bitdelta ms | ratio | W_hat cached ms |")
    _say("|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for n, k in CPU_SHAPES:
        w = torch.randn(n, k, generator=gen) * 0.05
        packed, alpha = compress(torch.randn(n, k, generator=gen) * 0.01)
        w_hat = cpu.reconstruct_weight(w, packed, alpha)
        for m in CPU_ROWS:
            x = torch.randn(m, k, generator=gen)
            dense = _cpu_time(lambda: F.linear(x, w))
            fused = _cpu_time(lambda: cpu.bitdelta_linear(x, w, packed, alpha))
            cached = _cpu_time(lambda: F.linear(x, w_hat))
            _say(f"| {n}×{k} | {m} | {dense:.3f} | {fused:.3f} | {fused / dense:.2f}× | {cached:.3f} |")


# ---- GPU ----------------------------------------------------------------------------------------

def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 2 GiB, bytes read + written per second (the practical ceiling)."""
    from triton.testing import do_bench

    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e9


def _graph_us(fn, calls: int) -> float:
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3 / calls


def _gpu_case(n, k, m, d, copy_gbs, device="cuda", timer=None) -> str:
    """One table row; ``device``/``timer`` let a CPU dry run (interpreter) exercise this code."""
    from zenedge.bitdelta.packing import packed_width

    from tools.gpu import bitdelta_baselines as published
    from zenedge.kernels.bitdelta.grouping import group_rows
    from zenedge.kernels.bitdelta.triton import bitdelta_linear, bitdelta_linear_multi

    timer = timer or _graph_us
    kb = packed_width(k)
    w_bytes = n * k * 2
    copies = max(1, math.ceil(L2_DEFEAT_BYTES / w_bytes))
    gen = torch.Generator(device=device).manual_seed(n + k + m + d)
    sets = []
    for _ in range(copies):
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.05
        packed = torch.randint(0, 256, (d, n, kb), device=device, dtype=torch.uint8, generator=gen)
        alpha = torch.rand(d, n, device=device, generator=gen) * 0.01
        sets.append((w, packed, alpha, published.as_int32_words(packed)))
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
    ids = torch.arange(m, device=device) % d
    grouping = group_rows(ids, d)
    row_sets = [(ids == i).nonzero().flatten() for i in range(d)]
    row_sets = [r if r.numel() else None for r in row_sets]
    used = sum(r is not None for r in row_sets)

    if d == 1:
        fused = lambda s: bitdelta_linear(x, s[0], s[1][0], s[2][0])                      # noqa: E731
        naive = lambda s: published.naive_linear(x, s[0], s[1][0], s[2][0])              # noqa: E731
        paper = lambda s: published.published_linear(x, s[0], s[3][0], s[2][0])          # noqa: E731
    else:
        fused = lambda s: bitdelta_linear_multi(x, s[0], s[1], s[2], grouping=grouping)  # noqa: E731
        naive = lambda s: published.naive_linear_multi(x, s[0], s[1], s[2], row_sets)    # noqa: E731
        paper = lambda s: published.published_linear_multi(x, s[0], s[3], s[2], row_sets)  # noqa: E731
    dense = lambda s: F.linear(x, s[0])                                                  # noqa: E731

    results = {}
    for name, op in (("fused", fused), ("dense", dense), ("naive", naive), ("paper", paper)):
        op(sets[0])                                                     # autotune / compile outside graphs
        if device == "cuda":
            torch.cuda.synchronize()
        results[name] = timer(lambda op=op: [op(s) for s in sets], len(sets))
    moved = w_bytes + used * (n * kb + 4 * n) + m * k * 2 + m * n * 2
    gbs = moved / (results["fused"] * 1e-6) / 1e9
    return (f"| {n}×{k} | {m} | {d} | {results['fused']:.1f} | {results['dense']:.1f} | "
            f"{results['fused'] / results['dense']:.3f}× | {results['naive'] / results['fused']:.1f}× | "
            f"{results['paper'] / results['fused']:.1f}× | {gbs:.0f} | {100 * gbs / copy_gbs:.0f}% |")


def run_gpu(quick: bool, check: bool) -> None:
    from tools.gpu import gpu_check
    from zenedge.kernels.bitdelta import autotune

    props = torch.cuda.get_device_properties(0)
    _say(f"GPU: {props.name}, {props.multi_processor_count} SMs; {_machine()}")
    if check:
        start = time.time()
        errors = gpu_check.precompile()
        _say(f"precompiled in {time.time() - start:.0f}s; compile errors: {len(errors)}")
        for e in errors:
            _say(f"  {e}")
        failures = gpu_check.check_configs()
        _say(f"correctness check: {len(failures)} failing (case, config) pairs, {time.time() - start:.0f}s total")
        for case, cfg, err in failures:
            _say(f"  FAIL {case} {cfg} rel.err={err:.3g}")
        gpu_check.exclude([cfg for _, cfg, _ in failures])
    copy_gbs = copy_bandwidth_gbs()
    _say(f"device copy bandwidth (read+write): {copy_gbs:.0f} GB/s")
    _say("| out×in | M | deltas | fused µs | dense µs | fused/dense | naive/fused | published/fused | GB/s | of copy |")
    _say("|---|---|---|---|---|---|---|---|---|---|")
    shapes = GPU_SHAPES[:1] if quick else GPU_SHAPES
    for n, k in shapes:
        for d in GPU_DELTAS:
            for m in GPU_ROWS:
                try:
                    _say(_gpu_case(n, k, m, d, copy_gbs))
                except Exception as exc:                   # keep the rest of the table
                    _say(f"| {n}×{k} | {m} | {d} | error: {type(exc).__name__}: {str(exc)[:120]} |")
    _say("chosen configs:")
    for key, cfg in sorted(autotune.chosen().items()):
        _say(f"  {key}: {cfg}")


def run_sass() -> None:
    from tools.gpu.sass import all_reports, format_table

    _say(f"SASS for sm_90a, compiled without a GPU, {datetime.date.today()} on {_machine()}")
    _say(format_table(all_reports()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu.bitdelta_kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--sass", action="store_true", help="compile every config for sm_90a, print the SASS table")
    parser.add_argument("--check", action="store_true", help="GPU: check every config first, exclude failures")
    parser.add_argument("--quick", action="store_true", help="GPU: first shape only")
    parser.add_argument("--threads", type=int, default=0, help="CPU: torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.sass:
        run_sass()
    elif torch.cuda.is_available():
        run_gpu(args.quick, args.check)
    else:
        run_cpu()
    return 0


if __name__ == "__main__":
    sys.exit(main())
