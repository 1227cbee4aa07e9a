"""Pick a KernelConfig per problem shape: benchmark the pruned candidates once on CUDA, cache.

On CPU tensors (the Triton interpreter, CI) there is nothing to time: the small interpreter
configs are used.
"""

from __future__ import annotations

from typing import Callable

import torch

from zenedge.paths import split_k_disabled

from .configs import (DECODE_ROWS, INTERPRET_DECODE, INTERPRET_PREFILL, KernelConfig, decode_candidates,
                      prefill_candidates)

_BEST: dict[str, KernelConfig] = {}
# Predicates that veto configs (e.g. a GPU check that found some unsafe on this driver).
EXCLUDE: list[Callable[[KernelConfig], bool]] = []


def _bucket(m: int) -> int:
    return m if m <= DECODE_ROWS else 1 << (m - 1).bit_length()


def problem_key(m: int, n: int, k: int, dtype: torch.dtype, num_deltas: int, grouped: bool, slots: int = 1) -> str:
    key = f"{'grouped' if grouped else 'single'}:m{_bucket(m)}:n{n}:k{k}:{dtype}:d{num_deltas}"
    return key + (f":s{slots}" if grouped and m <= DECODE_ROWS else "")


def candidates(m: int, n: int, k: int, device: torch.device, grouped: bool = False) -> list[KernelConfig]:
    if device.type != "cuda":
        return [INTERPRET_DECODE if m <= DECODE_ROWS else INTERPRET_PREFILL]
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    if m <= DECODE_ROWS:
        found = decode_candidates(n, k, num_sms, grouped)
    else:
        found = prefill_candidates(m, n, k, num_sms, grouped)
    no_split_k = split_k_disabled()
    kept = [cfg for cfg in found
            if not (no_split_k and cfg.split_k > 1) and not any(veto(cfg) for veto in EXCLUDE)]
    return kept or found[:1]


def choose(key: str, options: list[KernelConfig], run: Callable[[KernelConfig], object]) -> KernelConfig:
    """Return the cached winner for ``key``, timing each option with ``run`` on first use."""
    best = _BEST.get(key)
    if best is not None:
        return best
    if len(options) == 1:
        _BEST[key] = options[0]
        return options[0]
    from triton.testing import do_bench             # lazy: only CUDA callers get here

    timings = []
    for cfg in options:
        try:
            ms = do_bench(lambda: run(cfg), warmup=5, rep=20, return_mode="median")
        except Exception:                            # e.g. out of shared memory on this GPU
            continue
        timings.append((ms, cfg))
    if not timings:
        raise RuntimeError(f"no kernel config could run for {key}")
    best = min(timings, key=lambda t: t[0])[1]
    _BEST[key] = best
    return best


def chosen() -> dict[str, KernelConfig]:
    """The configs picked so far in this process (key -> config)."""
    return dict(_BEST)
