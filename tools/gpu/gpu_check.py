"""GPU-only helpers for the benchmark: compile every config in parallel, check each one's output.

``precompile`` fills Triton's on-disk cache from a pool of worker processes (one config each),
so the benchmark's autotuner loads kernels instead of compiling ~40 of them one by one.
``check_configs`` runs every candidate config on the GPU against the float64 reference and
returns the ones that failed; the benchmark excludes those.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import torch

from zenedge.kernels.bitdelta import autotune, reference
from zenedge.kernels.bitdelta.configs import (DECODE_CONFIGS, GROUPED_DECODE_CONFIGS, GROUPED_PREFILL_CONFIGS,
                                              PREFILL_CONFIGS, KernelConfig)
from zenedge.kernels.bitdelta.grouping import group_rows
from zenedge.kernels.bitdelta.launch import launch_grouped, launch_single

BF16_TOLERANCE = 1.5e-2       # W_eff is rounded to bf16 once: ~3e-3 expected


def _problem(m, n, k, deltas, device, seed=0, dtype=torch.bfloat16):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(device, dtype)
    packed = torch.randint(0, 256, (max(deltas, 1), n, (k + 7) // 8), generator=gen, dtype=torch.uint8).to(device)
    alpha = (torch.rand(max(deltas, 1), n, generator=gen) * 0.02).to(device)
    return x, w, packed, alpha


def _ids(m, deltas, device):
    ids = (torch.arange(m) + 1) % (deltas + 1) - 1      # row 0 gets delta 0; base rows too; mid-tile bounds
    return ids.to(device)


def run_config(kind: str, m: int, n: int, k: int, deltas: int, cfg: KernelConfig, device, seed=0,
               dtype=torch.bfloat16) -> float:
    """Relative error of one launch with ``cfg`` against the float64 reference (NaN-poisoned out)."""
    x, w, packed, alpha = _problem(m, n, k, deltas, device, seed, dtype)
    out = torch.full((m, n), float("nan"), dtype=x.dtype, device=device)
    if kind == "single":
        launch_single(x, w, packed[0], alpha[0], None, out, cfg)
        ref = reference.bitdelta_linear(x.double(), w.double(), packed[0], alpha[0].double())
    else:
        ids = _ids(m, deltas, device)
        launch_grouped(x, w, packed, alpha, group_rows(ids, deltas), None, out, cfg)
        ref = reference.bitdelta_linear_multi(x.double(), w.double(), packed, alpha.double(), ids)
    if torch.isnan(out).any():
        return float("inf")
    return float((out.double() - ref).norm() / ref.norm())


def _candidates(kind: str, m: int) -> tuple[KernelConfig, ...]:
    if m > 16:
        return GROUPED_PREFILL_CONFIGS if kind == "grouped" else PREFILL_CONFIGS
    return GROUPED_DECODE_CONFIGS if kind == "grouped" else DECODE_CONFIGS


def _compile_job(job) -> str:
    kind, m, n, k, deltas, cfg = job
    try:
        run_config(kind, m, n, k, deltas, cfg, torch.device("cuda"))
        return ""
    except Exception as exc:                                 # reported, not fatal
        return f"{kind} m={m} d={deltas} {cfg}: {type(exc).__name__}: {exc}"[:300]


def _worker_init() -> None:
    os.environ.pop("TRITON_INTERPRET", None)


# (kind, m, n, k, deltas, configs: all of the candidates or the first n): n, k multiples of 16
# share the model shapes' specialisation; the others are ragged (k = 200: sign rows of loose bytes;
# k = 224: whole words, but not whole K steps).
ALL = None
CHECK_PROBLEMS = (
    ("single", 1, 320, 1024, 1, ALL), ("single", 5, 320, 1024, 1, 3), ("single", 16, 320, 1024, 1, ALL),
    ("single", 304, 320, 1024, 1, ALL), ("grouped", 1, 320, 1024, 8, ALL), ("grouped", 3, 320, 1024, 8, ALL),
    ("grouped", 16, 320, 1024, 8, ALL), ("grouped", 304, 320, 1024, 8, ALL),
    ("grouped", 16, 320, 1024, 16, 1),
    ("single", 1, 130, 200, 1, 1), ("single", 77, 130, 200, 1, 1), ("grouped", 7, 130, 200, 3, 1),
    ("grouped", 77, 130, 200, 3, 1), ("single", 3, 130, 224, 1, 1), ("grouped", 5, 130, 224, 3, 1),
    ("single", 70, 130, 224, 1, 1),
)


def _jobs() -> list[tuple]:
    jobs = []
    for kind, m, n, k, d, count in CHECK_PROBLEMS:
        configs = _candidates(kind, m)
        jobs += [(kind, m, n, k, d, cfg) for cfg in configs[:count]]
    return jobs


def precompile(workers: int = 12) -> list[str]:
    """Compile every checked (problem, config) in worker processes; returns the errors."""
    jobs = _jobs()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_init) as pool:
        return [e for e in pool.map(_compile_job, jobs) if e]


def check_configs(device="cuda") -> list[tuple[str, KernelConfig, float]]:
    """Every config on aligned and ragged problems; returns (case, config, error) of the failures."""
    device = torch.device(device)
    failures = []
    for kind, m, n, k, d, cfg in _jobs():
        for repeat in range(2 if cfg.split_k > 1 else 1):              # 2nd run: workspace re-zeroed?
            try:
                err = run_config(kind, m, n, k, d, cfg, device, seed=repeat)
            except Exception:                                          # counts as a failure, run goes on
                err = float("nan")
            if not err < BF16_TOLERANCE:
                failures.append((f"{kind} m={m} n={n} k={k} d={d} run{repeat}", cfg, err))
    return failures


def exclude(configs: list[KernelConfig]) -> None:
    """Keep the autotuner away from configs that failed the check."""
    bad = set(configs)
    if bad:
        autotune.EXCLUDE.append(lambda cfg: cfg in bad)
