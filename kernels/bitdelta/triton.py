"""Public Triton entry points: y = x·(W + α⊙S)ᵀ (+b) in one launch, single delta or grouped.

Both run on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1 (how CI tests them).
"""

from __future__ import annotations

import torch

from . import autotune
from .configs import KernelConfig
from .grouping import RowGrouping, group_rows
from .launch import launch_grouped, launch_single


def _flatten(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2, lead


def bitdelta_linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor,
                    bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                    config: KernelConfig | None = None) -> torch.Tensor:
    """x[..., in] · (W[out, in] + alpha[out] ⊙ S)ᵀ (+ bias) -> [..., out]; packed is uint8 [out, ceil(in/8)]."""
    x2, lead = _flatten(x)
    m, n, k = x2.shape[0], weight.shape[0], weight.shape[1]
    out2 = out.view(-1, n) if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)

    def run(cfg: KernelConfig):
        return launch_single(x2, weight, packed, alpha, bias, out2, cfg)

    if config is None:
        key = autotune.problem_key(m, n, k, x.dtype, 1, grouped=False)
        config = autotune.choose(key, autotune.candidates(m, n, k, x.device), run)
    run(config)
    return out2.view(*lead, n)


def bitdelta_linear_multi(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor,
                          delta_ids: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
                          grouping: RowGrouping | None = None, out: torch.Tensor | None = None,
                          config: KernelConfig | None = None) -> torch.Tensor:
    """Row m of x uses delta ``delta_ids[m]`` of packed [D, out, ceil(in/8)] / alpha [D, out]; -1 = base.

    Pass ``grouping = group_rows(delta_ids, D)`` (computed once per batch, shared by all layers)
    instead of ``delta_ids`` to skip the per-call sort.
    """
    x2, lead = _flatten(x)
    m, n, k = x2.shape[0], weight.shape[0], weight.shape[1]
    num_deltas = packed.shape[0]
    if grouping is None:
        if delta_ids is None:
            raise ValueError("bitdelta_linear_multi needs delta_ids or grouping")
        grouping = group_rows(delta_ids.reshape(-1), num_deltas)
    out2 = out.view(-1, n) if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)

    def run(cfg: KernelConfig):
        return launch_grouped(x2, weight, packed, alpha, grouping, bias, out2, cfg)

    if config is None:
        # Decode compiles one kernel per slot count (distinct deltas present): tune per count too.
        slots = grouping.num_slots
        key = autotune.problem_key(m, n, k, x.dtype, num_deltas, grouped=True, slots=slots)
        config = autotune.choose(key, autotune.candidates(m, n, k, x.device, grouped=True), run)
    run(config)
    return out2.view(*lead, n)
