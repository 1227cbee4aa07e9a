"""1-bit sign packing: the on-disk and in-memory format every BitDelta path shares.

Contract (DESIGN.md): for a delta ``[out, in]`` the packed tensor is ``uint8[out, ceil(in/8)]``;
bit ``j`` of byte ``k`` in row ``o`` is 1 iff ``delta[o, 8k+j] > 0`` (LSB first along the input
dim). Everything else (zero, negative, NaN) packs to 0, which unpacks to -1. Padding bits past
``in_features`` are 0.
"""

from __future__ import annotations

import torch

# Rows per chunk when packing/unpacking large matrices: bounds the temporaries to a few MB.
_CHUNK_ELEMENTS = 1 << 22

_SIGN_TABLES: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def packed_width(in_features: int) -> int:
    """Bytes per packed row: ceil(in_features / 8)."""
    return (in_features + 7) // 8


def _rows_per_chunk(row_elements: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(1, row_elements))


def pack_signs(delta: torch.Tensor) -> torch.Tensor:
    """Pack ``sign(delta)`` of a ``[out, in]`` matrix into ``uint8[out, ceil(in/8)]``, LSB first."""
    if delta.dim() != 2:
        raise ValueError(f"pack_signs expects a 2-D [out, in] tensor, got shape {tuple(delta.shape)}")
    out_features, in_features = delta.shape
    width = packed_width(in_features)
    packed = torch.empty(out_features, width, dtype=torch.uint8, device=delta.device)
    step = _rows_per_chunk(width * 8)
    for start in range(0, out_features, step):
        rows = delta[start:start + step]
        positive = (rows > 0).to(torch.uint8)                        # [r, in] 0/1
        if width * 8 != in_features:                                 # zero padding bits
            positive = torch.nn.functional.pad(positive, (0, width * 8 - in_features))
        bits = positive.view(rows.shape[0], width, 8)                # [r, width, 8]
        byte = bits[:, :, 0].clone()
        for j in range(1, 8):                                        # 8 shifted ORs: no int64 temporaries
            byte |= bits[:, :, j] << j
        packed[start:start + step] = byte
    return packed


def _sign_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 8] table: row v holds the ±1 signs of byte value v, LSB first."""
    key = (dtype, device)
    table = _SIGN_TABLES.get(key)
    if table is None:
        values = torch.arange(256, dtype=torch.int32)
        bits = (values[:, None] >> torch.arange(8, dtype=torch.int32)) & 1    # [256, 8]
        table = (bits * 2 - 1).to(dtype=dtype, device=device)
        _SIGN_TABLES[key] = table
    return table


def unpack_signs(packed: torch.Tensor, in_features: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Unpack ``uint8[out, ceil(in/8)]`` (or ``[..., out, ceil(in/8)]``) into ±1 of ``dtype``."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed signs must be uint8, got {packed.dtype}")
    if packed.shape[-1] != packed_width(in_features):
        raise ValueError(
            f"packed width {packed.shape[-1]} does not match in_features={in_features} "
            f"(expected {packed_width(in_features)})")
    table = _sign_table(dtype, packed.device)
    lead = packed.shape[:-1]
    # One table gather per byte: 8 signs at once, no shift/and temporaries.
    signs = torch.nn.functional.embedding(packed.reshape(-1).to(torch.int32), table)   # [n_bytes, 8]
    signs = signs.view(*lead, packed.shape[-1] * 8)
    return signs[..., :in_features]


def compress(delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """1-bit code of a ``[out, in]`` delta: ``(packed signs, alpha)`` with ``alpha[o] = mean|delta[o,:]|``.

    alpha is fp32 (per output row, the L2-optimal scale for a sign code).
    """
    packed = pack_signs(delta)
    alpha = delta.abs().mean(dim=1, dtype=torch.float32)
    return packed, alpha


def decompress(packed: torch.Tensor, alpha: torch.Tensor, in_features: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dense ``alpha ⊙ S`` (``[out, in]``); for tests and small tools, not for serving."""
    return unpack_signs(packed, in_features, dtype) * alpha.to(dtype)[:, None]
