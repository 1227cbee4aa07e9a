"""The formats the pool stores LoRA factors in: as given (fp32 / fp16 / bf16), int8, or int4.

A float format is a plain PEFT file (the tensors in that dtype). A quantized file is safetensors
too, and says what it is in its metadata:

    "zenedge.storage"  "int8" or "int4"
    "zenedge.group"    values per scale (int8: a whole row)
    "zenedge.columns"  JSON {key: n}: a row's true length, for rows padded to a whole group

Under each PEFT key K (…lora_A.weight, …lora_B.weight) it holds the codes, under K + ".scale"
the scales. Both factors are stored rank-major, as [r, n] rows: A as it is, B transposed (and
with PEFT's scale folded in, so the adapter reads back with lora_alpha = r). A row of A is one
rank channel over the input features, a row of Bᵀ the same channel over the outputs, so every
scale covers one channel's values along the long side, and a group of 32 spans 32 inputs or
outputs rather than 8 rank entries.

    int8  codes int8 [r, n] in [-127, 127]; one fp32 scale per row (absmax / 127)
    int4  codes uint8 [r, n/2], two per byte, low nibble first, value + 8 in [1, 15]; one bf16
          scale per group of 32 (absmax / 7, rounded up). Symmetric with a zero: a factor's values centre on 0.

Reading dequantizes once, when a variant loads (`decode`); the factors are small, so serving
runs on float factors as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from torch import Tensor

from zenedge.adapters.safetensors_file import canonical

FLOATS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SMALLER = ("bf16", "int8", "int4")   # what the pool may re-store an adapter in, largest first
STORAGE_KEY, GROUP_KEY, COLUMNS_KEY = "zenedge.storage", "zenedge.group", "zenedge.columns"
SCALE_SUFFIX = ".scale"


@dataclass(frozen=True)
class Quantized:
    bits: int
    group: int | None   # values per scale; None: one scale per row

    @property
    def levels(self) -> int:
        return (1 << (self.bits - 1)) - 1    # 127, 7: symmetric around a zero code


QUANTIZED = {"int8": Quantized(8, None), "int4": Quantized(4, 32)}
FORMATS = (*FLOATS, *QUANTIZED)


def check_format(name: str) -> str:
    if name not in FORMATS:
        raise ValueError(f"unknown storage format {name!r}; choose from {', '.join(FORMATS)}")
    return name


def float_name(dtype: torch.dtype) -> str:
    return next((name for name, d in FLOATS.items() if d == dtype), "fp32")


def quantize(rows: Tensor, spec: Quantized) -> tuple[Tensor, Tensor, int]:
    """[r, n] float rows → (codes, scales, padded n)."""
    rows = rows.float()
    r, n = rows.shape
    group = spec.group or n
    padded = -(-n // group) * group
    grouped = torch.nn.functional.pad(rows, (0, padded - n)).view(r, padded // group, group)
    scales = grouped.abs().amax(-1) / spec.levels
    if spec.bits == 4:
        # Stored in bf16 (fp32's range: no scale underflows), rounded up so that no value lands
        # past the largest code, and the codes are taken against the scale as stored.
        scales = (scales * (1 + 2 ** -7)).to(torch.bfloat16)
    divisor = torch.where(scales == 0, torch.ones_like(scales), scales).float()
    codes = torch.round(grouped / divisor[..., None]).clamp(-spec.levels, spec.levels).view(r, padded)
    if spec.bits == 8:
        return codes.to(torch.int8), scales.float(), padded
    nibbles = (codes + 8).to(torch.uint8)
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4), scales, padded


def dequantize(codes: Tensor, scales: Tensor, spec: Quantized, n: int) -> Tensor:
    """The float32 [r, n] rows `quantize` encoded."""
    if spec.bits == 8:
        values = codes.float()
    else:
        values = torch.stack(((codes & 0xF), (codes >> 4)), dim=-1).view(codes.shape[0], -1).float() - 8
    r, padded = values.shape
    group = spec.group or padded
    values = values.view(r, padded // group, group) * scales.float()[..., None]
    return values.view(r, padded)[:, :n]


def encode(tensors: dict[str, Tensor], storage: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """PEFT-keyed factors (A [r, in], B [out, r], scale already folded into B) → the tensors and
    metadata of a file in `storage`."""
    check_format(storage)
    if storage in FLOATS:
        return {k: v.to(FLOATS[storage]).contiguous() for k, v in tensors.items()}, {"format": "pt"}
    spec = QUANTIZED[storage]
    out, columns = {}, {}
    for key, value in tensors.items():
        rows = value.t() if _is_b(key) else value
        codes, scales, padded = quantize(rows, spec)
        out[key], out[key + SCALE_SUFFIX] = codes.contiguous(), scales.contiguous()
        if padded != rows.shape[1]:
            columns[key] = rows.shape[1]
    metadata = {"format": "pt", STORAGE_KEY: storage, GROUP_KEY: str(spec.group or 0)}
    if columns:
        metadata[COLUMNS_KEY] = json.dumps(columns, sort_keys=True)
    return out, metadata


def encoded_file(tensors: dict[str, Tensor], storage: str) -> bytes:
    """The bytes of a safetensors file of PEFT-keyed factors in `storage`: the same tensors give the
    same bytes, so the same content digest."""
    from safetensors.torch import save

    encoded, metadata = encode(tensors, storage)
    return canonical(save(encoded, metadata=metadata))


def decode(tensors: dict[str, Tensor], metadata: dict[str, str] | None) -> dict[str, Tensor]:
    """The factors a file holds, PEFT-keyed, as float tensors (quantized ones as float32)."""
    storage = (metadata or {}).get(STORAGE_KEY)
    if storage is None:
        return tensors
    if storage not in QUANTIZED:
        raise ValueError(f"unknown storage {storage!r} in the file's metadata")
    group = int(metadata.get(GROUP_KEY, "0")) or None
    spec = Quantized(QUANTIZED[storage].bits, group)
    columns = json.loads(metadata.get(COLUMNS_KEY, "{}"))
    out = {}
    for key, codes in tensors.items():
        if key.endswith(SCALE_SUFFIX):
            continue
        n = columns.get(key, codes.shape[1] * (2 if spec.bits == 4 else 1))
        rows = dequantize(codes, tensors[key + SCALE_SUFFIX], spec, n)
        out[key] = rows.t().contiguous() if _is_b(key) else rows
    return out


def storage_of(dtypes: set[torch.dtype], metadata: dict[str, str] | None) -> str:
    """A file's format: its metadata's, else the widest float dtype among its tensors."""
    storage = (metadata or {}).get(STORAGE_KEY)
    if storage:
        return storage
    floats = [d for d in dtypes if d in FLOATS.values()]
    widest = max(floats, key=lambda d: (torch.finfo(d).bits, d == torch.bfloat16), default=torch.float32)
    return float_name(widest)


BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "int4": 4}


def smaller_than(storage: str, lowest: str) -> list[str]:
    """The formats smaller than `storage` the pool may step down to, down to `lowest` (one of SMALLER)."""
    return [name for name in SMALLER[:SMALLER.index(lowest) + 1] if BITS[name] < BITS[storage]]


def _is_b(key: str) -> bool:
    return ".lora_B" in key
