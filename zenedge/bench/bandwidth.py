"""What a decode step must read, and how fast this machine can move bytes.

Decode is memory-bound: every step streams every weight once (plus the KV cache), so the
bound on tokens/s is copy bandwidth ÷ bytes per step. `copy_bandwidth` measures the bandwidth in
the same process and thread setting as the decode it is compared with.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class StepBytes:
    """Bytes one decode step reads, by source. Batch rows share the weights' bytes."""

    weights: int          # every linear's weight read once (the decoder layers and lm_head)
    variants: int         # extra bytes of the batch's variants (LoRA factors, dense or packed deltas)
    kv_cache: int         # keys and values attended to, all rows

    @property
    def total(self) -> int:
        return self.weights + self.variants + self.kv_cache


def kv_bytes_per_position(layers: int, kv_heads: int, head_dim: int, element_size: int) -> int:
    """Keys plus values of one row at one position, all layers."""
    return 2 * layers * kv_heads * head_dim * element_size


def step_bytes(weight_bytes: int, variant_bytes: list[int], kv_per_position: int, context: list[int]) -> StepBytes:
    """One decode step of a batch: weights once, each DISTINCT variant's extra bytes once
    (rows sharing a variant share its reads), each row's KV cache over its own context."""
    return StepBytes(weight_bytes, sum(variant_bytes), kv_per_position * sum(context))


def mean_context(prompt: int, new_tokens: int) -> float:
    """Average number of cached positions a decode step attends to over a generation: the
    step producing token t (t = 1…n-1; token 0 comes from the prefill) attends to prompt + t."""
    steps = max(new_tokens - 1, 1)
    return prompt + (steps + 1) / 2


def ratio(achieved: float, limit: float) -> float:
    return achieved / limit if limit > 0 else float("nan")


def copy_bandwidth(megabytes: int = 256, repeats: int = 7) -> float:
    """Bytes/s of a torch copy between two large fp32 buffers, counting read + write (the
    convention a decode's 'bytes read' is compared with); median of `repeats`."""
    import torch

    n = megabytes * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)                                   # first touch: page faults are not bandwidth
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * n * 4 / statistics.median(times)
