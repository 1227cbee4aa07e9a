"""Shared helpers for the kernel tests: random problems and the error measure."""

from __future__ import annotations

import torch

from zenedge.bitdelta.packing import compress

# Relative-norm error allowed against the float64 reference, per activation dtype.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert not torch.isnan(actual).any(), "output has NaN: an element was not written"
    return float((actual.double() - expected).norm() / expected.norm())


def problem(m: int, n: int, k: int, dtype: torch.dtype, *, deltas: int = 0, seed: int = 0, bias: bool = False):
    """x [m, k], weight [n, k], packed/alpha for one delta (deltas=0) or a stack of `deltas`."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    weight = (torch.randn(n, k, generator=gen) * 0.1).to(dtype)
    count = max(deltas, 1)
    codes = [compress(torch.randn(n, k, generator=gen) * (0.02 * (i + 1))) for i in range(count)]
    packed = torch.stack([c[0] for c in codes])
    alpha = torch.stack([c[1] for c in codes])
    if deltas == 0:
        packed, alpha = packed[0], alpha[0]
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    return x, weight, packed, alpha, b


def poisoned(m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((m, n), float("nan"), dtype=dtype)
