"""Random adapters for the merge tests: float64, small shapes, reproducible from a seed."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from zenedge.merge.factors import LoraFactors

# Module name → ΔW shape (out, in): square, wide, tall, like q/k/v/o and MLP projections.
SHAPES = {"q_proj": (6, 6), "k_proj": (3, 6), "up_proj": (9, 6), "down_proj": (6, 9)}


def random_factors(gen: torch.Generator, shape: tuple[int, int], rank: int, scale: float = 1.0) -> LoraFactors:
    out_dim, in_dim = shape
    A = torch.randn(rank, in_dim, generator=gen, dtype=torch.float64)
    B = torch.randn(out_dim, rank, generator=gen, dtype=torch.float64)
    return LoraFactors(A, B, scale)


def random_adapter(seed: int, rank: int = 2, scale: float = 0.5, shapes: dict | None = None) -> dict[str, LoraFactors]:
    gen = torch.Generator().manual_seed(seed)
    return {name: random_factors(gen, shape, rank, scale) for name, shape in (shapes or SHAPES).items()}


def dense(adapter) -> dict[str, torch.Tensor]:
    return {name: f.delta() for name, f in adapter.items()}


def snapshot(adapter) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    return {name: (f.A.clone(), f.B.clone(), f.scale) for name, f in adapter.items()}


def unchanged(adapter, before) -> bool:
    return all(
        torch.equal(f.A, before[name][0]) and torch.equal(f.B, before[name][1]) and f.scale == before[name][2]
        for name, f in adapter.items()
    )


seeds = st.integers(min_value=0, max_value=2**31 - 1)
ranks = st.integers(min_value=1, max_value=3)
scales = st.floats(min_value=0.1, max_value=4.0)
