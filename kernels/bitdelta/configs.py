"""Tile configurations for the fused kernels, as data, and the shape rules that prune them.

Decode (M <= 16): one 16-row tile of x, W rows on the MMA's M side (64 rows: one full wgmma tile
per warpgroup), split K when there are too few W row tiles to cover the SMs. 128-row tiles make
ptxas drain the tensor pipe after every register-operand wgmma: left out (the SASS table in
RESULTS.md shows it).
Prefill: x rows on the MMA's M side, W_eff through shared memory as the B operand, BLOCK_K = 64.
A 4-warp 128 x 128 tile fits two programs on an SM, so one program's sign expansion can run
while the other's wgmma does; larger 8-warp tiles amortise the expansion over more rows.
"""

from __future__ import annotations

from dataclasses import dataclass

DECODE_ROWS = 16          # M at or below this takes the decode layout
# Grouped decode unrolls one slot per distinct delta inside the K loop (base rows need none), so
# a decode batch has at most DECODE_ROWS slots, slots_per_program(config) per program.
MAX_DECODE_SLOTS = DECODE_ROWS


def slots_per_program(cfg: "KernelConfig") -> int:
    """Slots one program accumulates (more slots: more programs per tile), spill-free in 3.6 and 3.9."""
    if cfg.slots is not None:
        return cfg.slots
    return 8 if cfg.block_k <= 64 else 2


@dataclass(frozen=True)
class KernelConfig:
    block_n: int          # W rows (output features) per program
    block_m: int          # x rows per program
    block_k: int          # K step; a multiple of 32 so sign words never straddle a step
    split_k: int = 1      # programs sharing one output tile along K (decode only)
    num_warps: int = 4
    num_stages: int = 3
    slots: int | None = None           # grouped decode: slot accumulators per program (None: by block_k)


def _decode(bn, bk, split, stages=3, slots=None):
    return KernelConfig(block_n=bn, block_m=DECODE_ROWS, block_k=bk, split_k=split, num_warps=4, num_stages=stages,
                        slots=slots)


# BLOCK_K = 256 only unsplit: split, ptxas trades registers for a drain after every register wgmma.
DECODE_CONFIGS: tuple[KernelConfig, ...] = (
    _decode(64, 128, 1), _decode(64, 128, 2), _decode(64, 128, 4), _decode(64, 128, 8),
    _decode(64, 256, 1), _decode(64, 256, 1, stages=4),
    _decode(64, 128, 1, stages=4), _decode(64, 128, 2, stages=4), _decode(64, 128, 4, stages=4),
    _decode(64, 128, 8, stages=4),
)

# Fewer slots per program: more programs per output tile (only the first reads W), shorter chains
# of small register-operand wgmmas per program.
GROUPED_DECODE_CONFIGS: tuple[KernelConfig, ...] = (
    _decode(64, 64, 1), _decode(64, 64, 2), _decode(64, 64, 4), _decode(64, 64, 8),
    _decode(64, 128, 1), _decode(64, 128, 2), _decode(64, 128, 4),
    _decode(64, 64, 1, slots=4), _decode(64, 64, 2, slots=4), _decode(64, 64, 4, slots=4),
)

# KernelConfig(block_n = W rows, block_m = x rows, ...). The 4-warp 128 x 128 tile uses 255 registers
# and ~100 KB of shared memory: two programs per SM. Two 8-warp programs per SM (128 registers)
# spill at BLOCK_K = 64 and measured slower at BLOCK_K = 32 on the H200 (RESULTS.md): left out.
PREFILL_CONFIGS: tuple[KernelConfig, ...] = (
    KernelConfig(128, 128, 64, num_warps=4, num_stages=3),
    KernelConfig(256, 128, 64, num_warps=8, num_stages=3),
    KernelConfig(128, 128, 64, num_warps=8, num_stages=3),
    KernelConfig(128, 64, 64, num_warps=4, num_stages=4),
)
GROUPED_PREFILL_CONFIGS = PREFILL_CONFIGS

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


def prefill_candidates(m: int, n: int, k: int, num_sms: int, grouped: bool = False) -> list[KernelConfig]:
    """Prefill configs whose row tile is not mostly padding and that make at least ~one wave."""
    keep = []
    pool = GROUPED_PREFILL_CONFIGS if grouped else PREFILL_CONFIGS
    for cfg in pool:
        if cfg.block_m > 2 * max(m, 16):
            continue
        programs = -(-n // cfg.block_n) * -(-m // cfg.block_m)
        if programs < num_sms // 2 and cfg.block_n * cfg.block_m > 128 * 64:
            continue
        keep.append(cfg)
    return keep or [pool[-1]]
