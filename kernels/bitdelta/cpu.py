"""The torch path for machines without CUDA: y = x·(W + α⊙S)ᵀ (+b), memory-bounded.

No dense S or W + α⊙S is ever built for a whole layer; two strategies, picked by rows M:
- M <= LUT_MAX_ROWS (decode): y = x·Wᵀ + α ⊙ (x·Sᵀ) with x·Sᵀ through byte lookup tables. For
  each byte position kb, T[kb, v, :] = Σ_j x[:, 8kb+j]·(±1 for bit j of v); then
  (x·Sᵀ)[n] = Σ_kb T[kb, packed[n, kb]]: one embedding_bag gather replaces 8 sign products.
- larger M (prefill): chunks of output rows of W_hat = W + α⊙S are rebuilt in fp32 (in C where
  the native kernels build: kernels/native/sign_add.c's zenedge_sign_dense, the same numbers) and
  go through one matmul each, so the unpack is paid once per weight and amortised over M rows.

Hot variants can skip the unpacking: ``reconstruct_weight`` builds the dense W + α⊙S once for a
plain F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zenedge.bitdelta.packing import packed_width

from ..native import sign_dense_fn
from .grouping import group_rows

LUT_MAX_ROWS = 8                   # above this, rebuilding W_hat chunks and one matmul is cheaper
_CHUNK_ELEMENTS = 1 << 20          # ~4 MB of fp32 temporaries per chunk, whatever the layer size
_BYTE_SIGNS: dict[torch.dtype, torch.Tensor] = {}
_OFFSETS: dict[int, torch.Tensor] = {}


def _byte_signs(dtype: torch.dtype) -> torch.Tensor:
    """[8, 256]: column v holds the ±1 signs of byte value v (LSB first)."""
    table = _BYTE_SIGNS.get(dtype)
    if table is None:
        bits = (torch.arange(256)[None, :] >> torch.arange(8)[:, None]) & 1
        table = _BYTE_SIGNS[dtype] = (bits * 2 - 1).to(dtype)
    return table


def _rows_per_chunk(per_row: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, per_row))


def _check(x, weight, packed, alpha):
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x [M, in] and weight [out, in] disagree: {tuple(x.shape)} vs {tuple(weight.shape)}")
    want = (weight.shape[0], packed_width(weight.shape[1]))
    if packed.dtype != torch.uint8 or tuple(packed.shape[-2:]) != want:
        raise ValueError(f"packed must be uint8 [..., {want[0]}, {want[1]}], got {packed.dtype} {tuple(packed.shape)}")
    if alpha.shape[-1] != weight.shape[0]:
        raise ValueError(f"alpha must end in {weight.shape[0]}, got {tuple(alpha.shape)}")


def _byte_offsets(width: int) -> torch.Tensor:
    """[KB] int32: first table row of each byte position (kb * 256), cached per width."""
    offsets = _OFFSETS.get(width)
    if offsets is None:
        offsets = _OFFSETS[width] = torch.arange(width, dtype=torch.int32) * 256
    return offsets


def sign_products(x: torch.Tensor, packed: torch.Tensor, in_features: int) -> torch.Tensor:
    """x[M, in] · S(packed [out, in/8])ᵀ -> fp32 [M, out] through byte lookup tables (small M)."""
    m = x.shape[0]
    out_features, width = packed.shape
    x32 = x.float()
    if width * 8 != in_features:
        x32 = F.pad(x32, (0, width * 8 - in_features))                   # zero pad to whole bytes
    table = torch.bmm(x32.view(m, width, 8).transpose(0, 1), _byte_signs(torch.float32).expand(width, 8, 256))
    # Fresh buffer, not .contiguous(): for M = 1 that keeps a stride of 256 on the size-1 dim and
    # sends embedding_bag down a far slower path.
    table = torch.empty(width * 256, m).copy_(table.transpose(1, 2).reshape(width * 256, m))   # [kb*256+v, M]
    offsets = _byte_offsets(width)
    step = _rows_per_chunk(width * 2)
    if step >= out_features:                                              # one chunk: no slicing
        return F.embedding_bag(packed.to(torch.int32).add_(offsets), table, mode="sum").T
    result = torch.empty(out_features, m, dtype=torch.float32)
    for start in range(0, out_features, step):
        idx = packed[start:start + step].to(torch.int32).add_(offsets)   # [c, KB] table rows
        result[start:start + step] = F.embedding_bag(idx, table, mode="sum")
    return result.T                                                       # [M, out]


def weight_chunks(weight: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor, dtype: torch.dtype):
    """Yield (start, W_hat[start:start+c]) with W_hat = W + α⊙S built in fp32 and rounded once."""
    out_features, in_features = weight.shape
    step = _rows_per_chunk(packed.shape[1] * 8)
    dense_rows = sign_dense_fn(weight, packed, alpha) if dtype == torch.float32 else None
    if dense_rows is not None:                                             # the same numbers, in C
        for start in range(0, out_features, step):
            yield start, dense_rows(start, min(start + step, out_features))
        return
    signs_of_byte = _byte_signs(torch.float32).T.contiguous()            # [256, 8]
    for start in range(0, out_features, step):
        chunk = packed[start:start + step]
        # One table gather per byte (8 signs at once) beats shift/and/compare/select passes.
        signs = F.embedding(chunk.to(torch.int32), signs_of_byte).view(chunk.shape[0], -1)[:, :in_features]
        w_hat = torch.addcmul(weight[start:start + step].float(), signs, alpha[start:start + step].float()[:, None])
        yield start, w_hat.to(dtype)


def _prefill(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor,
             bias: torch.Tensor | None) -> torch.Tensor:
    y = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    for start, w_hat in weight_chunks(weight, packed, alpha, x.dtype):
        stop = start + w_hat.shape[0]
        torch.matmul(x, w_hat.T, out=y[:, start:stop])
    if bias is not None:
        y += bias.to(y.dtype)
    return y


def bitdelta_linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor,
                    bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x[M, in] · (W + α⊙S)ᵀ (+b) -> [M, out] in x.dtype."""
    _check(x, weight, packed, alpha)
    if x.shape[0] > LUT_MAX_ROWS:
        return _finish(_prefill(x, weight, packed, alpha, bias), out)
    y = F.linear(x, weight, bias).float()
    y.addcmul_(sign_products(x, packed, weight.shape[1]), alpha.float())
    return _finish(y.to(x.dtype), out)


def bitdelta_linear_multi(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor,
                          delta_ids: torch.Tensor, bias: torch.Tensor | None = None, *,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """Row m uses delta ``delta_ids[m]`` of packed [D, out, in/8] / alpha [D, out]; -1 = base only."""
    _check(x, weight, packed, alpha)
    grouping = group_rows(delta_ids.reshape(-1), packed.shape[0])
    starts = grouping.seg_start.tolist()
    perm = grouping.perm.to(torch.int64)
    y = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    if starts[1] > starts[0]:                                             # base-only rows
        rows = perm[starts[0]:starts[1]]
        y[rows] = F.linear(x[rows], weight, bias)
    for d in range(packed.shape[0]):
        lo, hi = starts[d + 1], starts[d + 2]
        if hi > lo:
            rows = perm[lo:hi]
            y[rows] = bitdelta_linear(x[rows], weight, packed[d], alpha[d], bias)
    return _finish(y, out)


def _finish(y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return y
    out.copy_(y)
    return out


# ---- the dense form for hot variants -------------------------------------------------------------

def reconstruct_weight(weight: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor, *,
                       dtype: torch.dtype | None = None) -> torch.Tensor:
    """Dense W + α⊙S ([out, in], ``dtype`` or W's), built chunk by chunk: F.linear it directly."""
    result = torch.empty(weight.shape, dtype=dtype or weight.dtype)
    for start, w_hat in weight_chunks(weight, packed, alpha, result.dtype):
        result[start:start + w_hat.shape[0]] = w_hat
    return result
