"""Launchers for the fused kernel: check shapes, dtypes and contiguity, build the grid, launch.

Nothing here picks a tile shape; callers pass a KernelConfig (autotune.py chooses one).
"""

from __future__ import annotations

import dataclasses

import torch
import triton

from .configs import DECODE_ROWS, MAX_DECODE_SLOTS, KernelConfig, slots_per_program
from .fused_kernel import _decode_kernel, _prefill_kernel
from .grouping import RowGrouping

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


@dataclasses.dataclass(frozen=True)
class _Bits:
    """The sign bits as the kernels read them: int32 words when rows hold whole words, else bytes."""
    tensor: torch.Tensor
    words: bool
    limit: int                # words (or bytes) per row
    stride_d: int
    stride_n: int


def _bits(packed: torch.Tensor) -> _Bits:
    kb = packed.shape[-1]
    if kb % 4 == 0 and packed.storage_offset() % 4 == 0:
        # Same bytes read 4 at a time, little-endian: bit j of word q is bit j % 8 of byte 4q + j // 8,
        # i.e. element 32q + j, whatever the host's byte order (the kernels run on little-endian GPUs).
        view = packed.view(torch.int32)
        words, limit = True, kb // 4
    else:
        view, words, limit = packed, False, kb
    stride_d = view.stride(0) if view.dim() == 3 else 0
    return _Bits(view, words, limit, stride_d, view.stride(-2))


def _check_block_k(cfg: KernelConfig) -> None:
    if cfg.block_k % 32:
        raise KernelArgumentError(f"block_k must be a multiple of 32 (one sign word), got {cfg.block_k}")


def _launch_decode(x, weight, bits: _Bits, alpha, bias, out, cfg, *, grouping, m, n, k):
    n_tiles = triton.cdiv(n, cfg.block_n)
    row_tiles = 1 if grouping is not None else triton.cdiv(m, cfg.block_m)
    nslot = grouping.num_slots if grouping is not None else 1
    slots = min(nslot, slots_per_program(cfg))          # slot accumulators one program holds
    groups = triton.cdiv(nslot, slots)
    parts = cfg.split_k * groups                         # partial products per output tile
    if parts > 1:
        if row_tiles != 1:
            raise KernelArgumentError("split_k > 1 needs all rows in one tile (decode)")
        ws, cnt = _workspace(x.device, n_tiles, cfg)
    else:
        ws, cnt = alpha, alpha                           # unused placeholders (never dereferenced)
    _decode_kernel[(n_tiles, row_tiles, parts)](
        x, weight, bits.tensor, alpha, bias if bias is not None else alpha, out,
        grouping.perm if grouping is not None else alpha, grouping.slots if grouping is not None else alpha,
        ws, cnt,
        m, n, k, bits.limit, nslot,
        x.stride(0), weight.stride(0), bits.stride_d, bits.stride_n,
        alpha.stride(0) if alpha.dim() == 2 else 0, out.stride(0),
        BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        SLOTS=slots, SLOT_GROUPS=groups, GROUPED=grouping is not None,
        WORDS=bits.words, EVEN_K=k % cfg.block_k == 0, HAS_BIAS=bias is not None,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", ASM=x.is_cuda,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def _launch_prefill(x, weight, bits: _Bits, alpha, bias, out, cfg, *, grouping, m, n, k):
    if grouping is not None:
        num_seg = grouping.num_deltas + 1
        # Each non-empty segment wastes at most one partial tile: a fixed upper bound, no sync.
        row_tiles = triton.cdiv(m, cfg.block_m) + min(num_seg, m)
        perm, seg_start = grouping.perm, grouping.seg_start
    else:
        num_seg, row_tiles, perm, seg_start = 1, triton.cdiv(m, cfg.block_m), alpha, alpha
    _prefill_kernel[(row_tiles, triton.cdiv(n, cfg.block_n))](
        x, weight, bits.tensor, alpha, bias if bias is not None else alpha, out, perm, seg_start,
        m, n, k, bits.limit, num_seg,
        x.stride(0), weight.stride(0), bits.stride_d, bits.stride_n,
        alpha.stride(0) if alpha.dim() == 2 else 0, out.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUPED=grouping is not None, SEG_P2=triton.next_power_of_2(max(num_seg, 2)),
        WORDS=bits.words, EVEN_K=k % cfg.block_k == 0,
        OFFSETS_64=max(x.shape[0] * x.stride(0), n * weight.stride(0)) >= 2**31, HAS_BIAS=bias is not None,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", ASM=x.is_cuda,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def launch_single(x, weight, packed, alpha, bias, out, cfg: KernelConfig) -> torch.Tensor:
    """y[M, out] = x·(W + α⊙S)ᵀ (+b), one delta: packed [out, in/8], alpha [out].

    A config with block_m <= DECODE_ROWS takes the decode kernel, any other the prefill kernel.
    """
    m, n, k, _ = _check_common(x, weight, packed, alpha, bias, out, grouped=False)
    _check_block_k(cfg)
    out = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    launch = _launch_decode if cfg.block_m <= DECODE_ROWS else _launch_prefill
    return launch(x, weight, _bits(packed), alpha, bias, out, cfg, grouping=None, m=m, n=n, k=k)


def launch_grouped(x, weight, packed, alpha, grouping: RowGrouping, bias, out, cfg: KernelConfig) -> torch.Tensor:
    """Rows of x carry their own delta (grouping from group_rows): packed [D, out, in/8], alpha [D, out]."""
    m, n, k, _ = _check_common(x, weight, packed, alpha, bias, out, grouped=True)
    _check_block_k(cfg)
    if grouping.num_rows != m or grouping.num_deltas != packed.shape[0]:
        raise KernelArgumentError(
            f"grouping is for {grouping.num_rows} rows / {grouping.num_deltas} deltas, "
            f"inputs have {m} rows / {packed.shape[0]} deltas")
    out = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    bits = _bits(packed)
    if m <= cfg.block_m and cfg.block_m == DECODE_ROWS and grouping.num_slots <= MAX_DECODE_SLOTS:
        return _launch_decode(x, weight, bits, alpha, bias, out, cfg, grouping=grouping, m=m, n=n, k=k)
    cfg = dataclasses.replace(cfg, split_k=1)           # tiles layout: every program owns whole K
    return _launch_prefill(x, weight, bits, alpha, bias, out, cfg, grouping=grouping, m=m, n=n, k=k)
