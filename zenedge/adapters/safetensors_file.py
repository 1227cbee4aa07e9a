"""Torch-free reading and validation of safetensors files.

A safetensors file is: 8 bytes little-endian header length N, N bytes of JSON header
({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}), then the data.
We validate everything a hostile or truncated file could get wrong before trusting any of it:
header size, JSON, dtypes, shapes, offsets inside the file and consistent with the shapes,
no overlaps, no trailing garbage. Values are checked for NaN/Inf with numpy, streaming.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from zenedge.errors import InvalidAdapter

# Bytes per element. BF16 is read as uint16 bit patterns (numpy has no bfloat16).
DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1}
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
MAX_HEADER = 100 * 2**20  # real headers are kilobytes; more is an attack or corruption


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offsets
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int
    file_size: int


def canonical(data: bytes) -> bytes:
    """The same safetensors file with its header's keys in sorted order. The library writes the
    metadata in hash-map order, which changes from one write to the next: without this, the same
    tensors stored twice would get two content digests (two adapter ids, no dedup)."""
    header_len = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8:8 + header_len]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-(8 + len(header)) % 8)   # the data starts 8-byte aligned, as the library lays it out
    return len(header).to_bytes(8, "little") + header + data[8 + header_len:]


def read_header(path: Path) -> SafetensorsHeader:
    """Parse and validate the header of `path`; raise InvalidAdapter with a one-line reason."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise InvalidAdapter(f"{path.name}: truncated safetensors file ({size} bytes)")
            header_len = int.from_bytes(prefix, "little")
            if header_len > MAX_HEADER or header_len > size - 8:
                raise InvalidAdapter(f"{path.name}: safetensors header claims {header_len} bytes, file has {size}")
            raw = handle.read(header_len)
    except OSError as exc:
        raise InvalidAdapter(f"{path.name}: cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidAdapter(f"{path.name}: safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise InvalidAdapter(f"{path.name}: safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InvalidAdapter(f"{path.name}: safetensors metadata must map strings to strings")
    data_start = 8 + header_len
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        tensors[name] = _tensor_info(path, name, entry, data_start, size)
    _check_layout(path, tensors, data_start, size)
    return SafetensorsHeader(path, tensors, metadata, data_start, size)


def _tensor_info(path: Path, name: str, entry: object, data_start: int, size: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise InvalidAdapter(f"{path.name}: tensor {name!r} entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        raise InvalidAdapter(f"{path.name}: tensor {name!r} has unsupported dtype {dtype!r}")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape)):
        raise InvalidAdapter(f"{path.name}: tensor {name!r} has an invalid shape {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise InvalidAdapter(f"{path.name}: tensor {name!r} has invalid data_offsets")
    begin, end = data_start + offsets[0], data_start + offsets[1]
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if not (data_start <= begin <= end <= size) or end - begin != expected:
        raise InvalidAdapter(
            f"{path.name}: tensor {name!r} claims bytes {offsets} for shape {shape} {dtype} "
            f"(needs {expected}); the file is truncated or corrupt"
        )
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _check_layout(path: Path, tensors: dict[str, TensorInfo], data_start: int, size: int) -> None:
    position = data_start
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != position:
            problem = "overlaps another" if info.begin < position else "leaves a gap before it"
            raise InvalidAdapter(f"{path.name}: tensor {info.name!r} {problem}; the file is corrupt")
        position = info.end
    if position != size:
        raise InvalidAdapter(f"{path.name}: {size - position} unexpected bytes after the tensor data")


def check_finite(header: SafetensorsHeader, chunk_bytes: int = 1 << 22) -> None:
    """Raise InvalidAdapter naming the first float tensor that holds a NaN or an Inf."""
    import numpy as np

    views = {"F64": np.float64, "F32": np.float32, "F16": np.float16}
    with open(header.path, "rb") as handle:
        for info in header.tensors.values():
            if info.dtype not in FLOAT_DTYPES or info.numel == 0:
                continue
            item = DTYPE_SIZES[info.dtype]
            step = max(item, chunk_bytes - chunk_bytes % item)
            handle.seek(info.begin)
            remaining = info.end - info.begin
            while remaining:
                data = handle.read(min(step, remaining))
                remaining -= len(data)
                if info.dtype == "BF16":
                    # exponent bits all ones ⇔ Inf or NaN
                    bad = bool(np.any((np.frombuffer(data, "<u2") & 0x7F80) == 0x7F80))
                else:
                    bad = not bool(np.isfinite(np.frombuffer(data, views[info.dtype])).all())
                if bad:
                    raise InvalidAdapter(f"{header.path.name}: tensor {info.name!r} contains NaN or Inf")
