"""Launchers for the fused kernel: check shapes, dtypes and contiguity, build the grid, launch.

Nothing here picks a tile shape; callers pass a KernelConfig (autotune.py chooses one).
"""

from __future__ import annotations

import dataclasses

import torch
import triton

from .configs import DECODE_ROWS, MAX_DECODE_SLOTS, KernelConfig
from .fused_kernel import _bitdelta_kernel
from .grouping import RowGrouping

ROW_SINGLE, ROW_TILES, ROW_SLOTS = 0, 1, 2
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Split-K workspace per device: fp32 partial tiles and int32 tickets, zero between launches
# (the kernel re-zeroes what it used). One stream at a time per device.
_WORKSPACES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


class KernelArgumentError(ValueError):
    """Inputs the fused kernel cannot take (shape, dtype, device or layout)."""


def _check_common(x, weight, packed, alpha, bias, out, *, grouped: bool) -> tuple[int, int, int, int]:
    if x.dim() != 2 or weight.dim() != 2:
        raise KernelArgumentError(f"x must be [M, in] and weight [out, in]; got {tuple(x.shape)}, {tuple(weight.shape)}")
    m, k = x.shape
    n, k_w = weight.shape
    if k != k_w:
        raise KernelArgumentError(f"x has in_features={k} but weight has {k_w}")
    if x.dtype not in _FLOAT_DTYPES or weight.dtype != x.dtype:
        raise KernelArgumentError(f"x and weight must share one of fp16/bf16/fp32; got {x.dtype}, {weight.dtype}")
    kb = (k + 7) // 8
    want_packed = (packed.shape[0], n, kb) if grouped else (n, kb)
    if packed.dtype != torch.uint8 or tuple(packed.shape) != want_packed:
        raise KernelArgumentError(f"packed must be uint8 {want_packed}; got {packed.dtype} {tuple(packed.shape)}")
    want_alpha = (packed.shape[0], n) if grouped else (n,)
    if alpha.dtype != torch.float32 or tuple(alpha.shape) != want_alpha:
        raise KernelArgumentError(f"alpha must be float32 {want_alpha}; got {alpha.dtype} {tuple(alpha.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise KernelArgumentError(f"bias must be [{n}]; got {tuple(bias.shape)}")
    if out is not None and (tuple(out.shape) != (m, n) or out.dtype != x.dtype or out.stride(1) != 1):
        raise KernelArgumentError(f"out must be a row-major {x.dtype} [{m}, {n}] tensor")
    tensors = [x, weight, packed, alpha] + [t for t in (bias, out) if t is not None]
    if len({t.device for t in tensors}) != 1:
        raise KernelArgumentError("all tensors must be on one device")
    if x.stride(1) != 1 or not weight.is_contiguous() or not packed.is_contiguous() or not alpha.is_contiguous():
        raise KernelArgumentError("x needs unit stride along in_features; weight, packed, alpha must be contiguous")
    if bias is not None and not bias.is_contiguous():
        raise KernelArgumentError("bias must be contiguous")
    return m, n, k, kb


def _workspace(device: torch.device, tiles: int, cfg: KernelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    need = tiles * cfg.block_n * cfg.block_m
    ws, cnt = _WORKSPACES.get(device, (None, None))
    if ws is None or ws.numel() < need or cnt.numel() < tiles:
        ws = torch.zeros(max(need, 1), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(tiles, 1), dtype=torch.int32, device=device)
        _WORKSPACES[device] = (ws, cnt)
    return ws, cnt


def _launch(x, weight, packed, alpha, bias, out, cfg, *, row_mode, row_tiles, perm, seg_start, slots,
            num_seg, nslot, m, n, k, kb):
    n_tiles = triton.cdiv(n, cfg.block_n)
    if cfg.split_k > 1:
        if row_tiles != 1:
            raise KernelArgumentError("split_k > 1 needs all rows in one tile (decode)")
        ws, cnt = _workspace(x.device, n_tiles, cfg)
    else:
        ws, cnt = alpha, alpha                           # unused placeholders (never dereferenced)
    dummy_i32 = seg_start if seg_start is not None else alpha
    grid = (n_tiles, row_tiles, cfg.split_k)
    _bitdelta_kernel[grid](
        x, weight, packed, alpha, bias if bias is not None else alpha, out,
        perm if perm is not None else dummy_i32, dummy_i32, slots if slots is not None else dummy_i32, ws, cnt,
        m, n, k, kb, num_seg,
        x.stride(0), weight.stride(0),
        packed.stride(0) if packed.dim() == 3 else 0, packed.stride(-2),
        alpha.stride(0) if alpha.dim() == 2 else 0, out.stride(0),
        BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        ROW_MODE=row_mode, NSLOT=nslot, SEG_P2=triton.next_power_of_2(max(num_seg, 2)),
        HAS_BIAS=bias is not None, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def launch_single(x, weight, packed, alpha, bias, out, cfg: KernelConfig) -> torch.Tensor:
    """y[M, out] = x·(W + α⊙S)ᵀ (+b), one delta: packed [out, in/8], alpha [out]."""
    m, n, k, kb = _check_common(x, weight, packed, alpha, bias, out, grouped=False)
    if cfg.block_k % 8:
        raise KernelArgumentError(f"block_k must be a multiple of 8, got {cfg.block_k}")
    out = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    return _launch(x, weight, packed, alpha, bias, out, cfg, row_mode=ROW_SINGLE,
                   row_tiles=triton.cdiv(m, cfg.block_m), perm=None, seg_start=None, slots=None,
                   num_seg=1, nslot=1, m=m, n=n, k=k, kb=kb)


def launch_grouped(x, weight, packed, alpha, grouping: RowGrouping, bias, out, cfg: KernelConfig) -> torch.Tensor:
    """Rows of x carry their own delta (grouping from group_rows): packed [D, out, in/8], alpha [D, out]."""
    m, n, k, kb = _check_common(x, weight, packed, alpha, bias, out, grouped=True)
    if grouping.num_rows != m or grouping.num_deltas != packed.shape[0]:
        raise KernelArgumentError(
            f"grouping is for {grouping.num_rows} rows / {grouping.num_deltas} deltas, "
            f"inputs have {m} rows / {packed.shape[0]} deltas")
    out = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    num_seg = grouping.num_deltas + 1
    if m <= cfg.block_m and cfg.block_m == DECODE_ROWS and grouping.num_slots <= MAX_DECODE_SLOTS:
        return _launch(x, weight, packed, alpha, bias, out, cfg, row_mode=ROW_SLOTS, row_tiles=1,
                       perm=grouping.perm, seg_start=grouping.seg_start, slots=grouping.slots,
                       num_seg=num_seg, nslot=grouping.num_slots, m=m, n=n, k=k, kb=kb)
    cfg = dataclasses.replace(cfg, split_k=1)           # tiles layout: every program owns whole K
    # Each non-empty segment wastes at most one partial tile: a fixed upper bound, no sync.
    row_tiles = triton.cdiv(m, cfg.block_m) + min(num_seg, m)
    return _launch(x, weight, packed, alpha, bias, out, cfg, row_mode=ROW_TILES, row_tiles=row_tiles,
                   perm=grouping.perm, seg_start=grouping.seg_start, slots=None,
                   num_seg=num_seg, nslot=1, m=m, n=n, k=k, kb=kb)
