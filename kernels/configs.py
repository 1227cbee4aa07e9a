"""Tile configurations for the fused kernel, as data, and the shape rules that prune them.

Decode (M <= 16): one 16-row tile of x, W rows on the MMA's M side (64/128 rows: a full wgmma
tile per warpgroup), split K when there are too few W row tiles to cover the SMs.
Prefill: square-ish tiles with BLOCK_K = 64 and 3-4 pipeline stages, the usual Hopper GEMM shapes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

DECODE_ROWS = 16          # M at or below this takes the decode layout
# Grouped decode unrolls one slot per distinct delta (+ base) inside the K loop. Up to 9 slots
# (8 deltas + base rows) compile without spills under triton 3.6 and 3.9; 16 slots spill, so a
# batch with more distinct deltas takes the tiles layout (one program per delta segment).
MAX_DECODE_SLOTS = 9


@dataclass(frozen=True)
class KernelConfig:
    block_n: int          # W rows (output features) per program
    block_m: int          # x rows per program
    block_k: int          # K step; a multiple of 8 so sign bytes never straddle a step
    split_k: int = 1      # programs sharing one output tile along K (decode only)
    num_warps: int = 4
    num_stages: int = 3

    def as_dict(self) -> dict:
        return asdict(self)


def _decode(bn, bk, split, stages=3):
    return KernelConfig(block_n=bn, block_m=DECODE_ROWS, block_k=bk, split_k=split, num_warps=4, num_stages=stages)


DECODE_CONFIGS: tuple[KernelConfig, ...] = (
    _decode(64, 128, 1), _decode(64, 128, 2), _decode(64, 128, 4), _decode(64, 128, 8),
    _decode(64, 256, 1), _decode(64, 256, 2), _decode(64, 256, 4),
    _decode(128, 128, 1), _decode(128, 128, 2),
    _decode(64, 128, 2, stages=4), _decode(64, 256, 1, stages=4),
)

# Grouped decode unrolls one W_eff tile per delta slot; BLOCK_K = 64 keeps up to 16 slots in
# registers without spilling (BLOCK_K = 128 spills from 9 slots on, see RESULTS.md).
GROUPED_DECODE_CONFIGS: tuple[KernelConfig, ...] = (
    _decode(64, 64, 1), _decode(64, 64, 2), _decode(64, 64, 4), _decode(64, 64, 8),
    _decode(64, 64, 1, stages=4), _decode(64, 64, 2, stages=4),
)

# (256 x 128 tiles and 128 x 128 on 4 warps spill under sm_90a: left out, see RESULTS.md.)
PREFILL_CONFIGS: tuple[KernelConfig, ...] = (
    KernelConfig(128, 128, 64, num_warps=8, num_stages=3),
    KernelConfig(128, 128, 64, num_warps=8, num_stages=4),
    KernelConfig(128, 256, 64, num_warps=8, num_stages=3),
    KernelConfig(128, 256, 64, num_warps=8, num_stages=4),
    KernelConfig(128, 64, 64, num_warps=4, num_stages=4),
    KernelConfig(64, 128, 64, num_warps=4, num_stages=4),
)

# Small tiles for the CPU interpreter (CI): several K steps and ragged edges on tiny shapes.
INTERPRET_DECODE = KernelConfig(block_n=16, block_m=DECODE_ROWS, block_k=32, split_k=2)
INTERPRET_PREFILL = KernelConfig(block_n=64, block_m=64, block_k=64)


def decode_candidates(n: int, k: int, num_sms: int, grouped: bool = False) -> list[KernelConfig]:
    """Decode configs that give each SM at least one program and each split >= 2 K steps."""
    keep = []
    pool = GROUPED_DECODE_CONFIGS if grouped else DECODE_CONFIGS
    for cfg in pool:
        programs = -(-n // cfg.block_n) * cfg.split_k
        k_steps = -(-k // (cfg.block_k * cfg.split_k))
        if cfg.split_k > 1 and k_steps < 2:
            continue
        if programs > 8 * num_sms and cfg.split_k > 1:
            continue                                  # enough programs already: splitting only adds fixup
        if programs < num_sms // 2 and cfg.split_k < 8:
            continue
        keep.append(cfg)
    return keep or [pool[0]]


def prefill_candidates(m: int, n: int, k: int, num_sms: int) -> list[KernelConfig]:
    """Prefill configs whose row tile is not mostly padding and that make at least ~one wave."""
    keep = []
    for cfg in PREFILL_CONFIGS:
        if cfg.block_m > 2 * max(m, 16):
            continue
        programs = -(-n // cfg.block_n) * -(-m // cfg.block_m)
        if programs < num_sms // 2 and cfg.block_n * cfg.block_m > 128 * 64:
            continue
        keep.append(cfg)
    return keep or [PREFILL_CONFIGS[-1]]
