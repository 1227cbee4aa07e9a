"""A GGUF checkpoint's tensors as zenedge keeps them: quantized blocks mapped bit for bit onto the
C kernels' formats, the rest dequantized.

llama.cpp's Q4_0, Q4_1 and Q4_K are int4 codes in groups of 32 inputs with a scale (and a
minimum) per group, which is what kernels/native/int4_gemv.c multiplies:

- Q4_0: W = (q - 8)·d with d fp16, i.e. q·d + m with m = -8 d (exact in fp16): fp16 scales;
- Q4_1: W = q·d + m, d and m fp16: fp16 scales;
- Q4_K: super-blocks of 256 with fp16 d and dmin, and 6-bit sc and m per 32: W = q·(d·sc) - dmin·m.
  d·sc needs up to 17 significant bits, exact in fp32 but not in fp16: fp32 scales.

Q8_0 (int8 codes, an fp16 scale per 32) is int8_gemv.c's format as it is. Those tensors become
cpu_weights copies holding the file's own codes and scales: their dequantized weights equal
gguf-py's `dequantize` bit for bit (tests/test_gguf_file.py). Any other type (Q5_0, Q6_K, …) is
dequantized here and requantized by the caller, with the loss reported at `base add`.

Names: GGUF's tensor names (`blk.3.attn_q.weight`) are matched to the model's parameter names
through gguf-py's own name map for the file's architecture. llama.cpp's converter permutes the
rows of a llama model's q and k projections (its rotary embedding pairs dimensions differently);
rows are whole groups, so undoing it is a reordering of rows, codes and scales alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

FILENAME = "model.gguf"             # a GGUF-backed base's weights, in its store directory

# The architectures whose tensors map onto transformers' model one to one, and whether the
# converter permuted their q/k rows. Others are converted the slow way (bases.convert_gguf).
ARCHITECTURES = {"llama": True, "mistral": True, "qwen2": False, "qwen3": False}
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
INT8_TYPES = ("Q8_0",)
IGNORED = ("rope_freqs.weight",)
# What a decoder linear of another type (Q5_0, Q6_K, …) is requantized to at load: Q8_0, whose loss
# is a tenth of int4's (`base add` reports it per type)
REQUANTIZED = "q8"    # computed from the config by transformers


@dataclass(frozen=True)
class Int4Blocks:
    """Codes q [rows, inputs] uint8 (0..15), scale and minimum [rows, inputs/32]: W = q·scale + minimum."""

    codes: torch.Tensor
    scale: torch.Tensor
    minimum: torch.Tensor


@dataclass(frozen=True)
class Int8Blocks:
    """Codes [rows, inputs] int8 and an fp16 scale [rows, inputs/32]: W = codes·scale."""

    codes: torch.Tensor
    scale: torch.Tensor


@dataclass(frozen=True)
class Tensor:
    """One entry of a GGUF file's tensor table: as gguf-py's reader gives it (`shape` innermost
    dimension first; `data` uint8 [rows, bytes per row] for a quantized type, the values for
    F32/F16/BF16), `data` read from the file when asked for: a read into fresh memory, not a
    mapping, whose pages would count in the process's RSS for as long as the map lives (a 1.7B
    load peaked 1.3 GiB higher so)."""

    name: str
    tensor_type: object       # gguf.GGMLQuantizationType
    shape: np.ndarray
    path: Path
    offset: int               # of its bytes in the file
    layout: tuple             # (numpy dtype, shape) of `data`

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def data(self) -> np.ndarray:
        dtype, data_shape = self.layout
        count = int(np.prod(data_shape))
        values = np.fromfile(self.path, dtype=dtype, count=count, offset=self.offset)
        if values.size != count:
            raise ValueError(f"{self.path}: the file ends inside tensor {self.name}")
        return values.reshape(data_shape)


@dataclass(frozen=True)
class Table:
    """A GGUF file's scalar metadata and tensor table."""

    fields: dict
    tensors: list


# GGUF's metadata value types: struct codes of the fixed-size ones; 8 string, 9 array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_PLAIN_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def reader(path: Path) -> Table:
    """The file's scalar metadata and tensor table (each tensor's bytes read when asked for).

    gguf-py's GGUFReader makes a numpy view of every part of every field: for a 49k-token
    vocabulary that is 4 s per parse, and a load needs none of the vocabulary (the tokenizer was
    written at `base add`). Here arrays are skipped over and only scalars and strings kept."""
    import struct

    import gguf as gguf_py

    data = np.memmap(path, dtype=np.uint8, mode="r")
    buffer = memoryview(data)
    at = 0

    def take(fmt: str):
        nonlocal at
        value = struct.unpack_from(fmt, buffer, at)
        at += struct.calcsize(fmt)
        return value[0]

    def string() -> str:
        nonlocal at
        size = take("<Q")
        at += size
        return bytes(buffer[at - size:at]).decode("utf-8", "replace")

    def value(kind: int):
        nonlocal at
        if kind in _SCALARS:
            return take(_SCALARS[kind])
        if kind == 8:
            return string()
        if kind != 9:
            raise ValueError(f"unknown metadata type {kind}")
        inner, count = take("<I"), take("<Q")
        if inner in _SCALARS:                  # skipped: no array is needed here
            at += count * struct.calcsize(_SCALARS[inner])
        else:
            for _ in range(count):
                value(inner)
        return None

    if bytes(buffer[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    at = 4
    version, tensor_count, field_count = take("<I"), take("<Q"), take("<Q")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    fields = {}
    for _ in range(field_count):
        key = string()
        fields[key] = value(take("<I"))
    entries = []
    for _ in range(tensor_count):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        entries.append((name, dims, gguf_py.GGMLQuantizationType(take("<I")), take("<Q")))
    alignment = int(fields.get("general.alignment") or gguf_py.GGUF_DEFAULT_ALIGNMENT)
    start = -(-at // alignment) * alignment
    tensors = []
    for name, dims, kind, offset in entries:
        block, size = gguf_py.GGML_QUANT_SIZES[kind]
        torch_shape = tuple(reversed(dims))
        if kind.name in _PLAIN_DTYPES:
            layout = (_PLAIN_DTYPES[kind.name], torch_shape)
        else:
            layout = (np.uint8, (*torch_shape[:-1], dims[0] // block * size))
        tensors.append(Tensor(name, kind, np.array(dims), Path(path), start + offset, layout))
    return Table(fields, tensors)


def field(gguf, name: str, default=None):
    """A scalar or string metadata field of the file (arrays read as None)."""
    value = gguf.fields.get(name)
    return default if value is None else value


def architecture(gguf) -> str:
    return field(gguf, "general.architecture", "")


def type_name(tensor) -> str:
    return tensor.tensor_type.name


def shape(tensor) -> tuple[int, ...]:
    """[rows, inputs] in torch's order (GGUF lists the innermost dimension first)."""
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def parameter_names(gguf, keys: Iterable[str]) -> dict[str, str] | None:
    """{GGUF tensor name: model parameter key} for every tensor of the file (IGNORED left out), or
    None where one names no parameter (an architecture or tensor this map does not know)."""
    import gguf as gguf_py

    arch = architecture(gguf)
    ids = {name: arch_id for arch_id, name in gguf_py.MODEL_ARCH_NAMES.items()}
    if arch not in ARCHITECTURES or arch not in ids:
        return None
    blocks = int(field(gguf, f"{arch}.block_count", 0))
    name_map = gguf_py.get_tensor_name_map(ids[arch], blocks)
    names = {}
    for key in keys:
        mapped = name_map.get_name(key, try_suffixes=(".weight", ".bias"))
        if mapped is not None:
            names[mapped] = key
    tensors = [t.name for t in gguf.tensors if t.name not in IGNORED]
    if any(name not in names for name in tensors):
        return None
    return {name: names[name] for name in tensors}


def row_order(gguf, key: str, rows: int, heads: int, kv_heads: int) -> torch.Tensor | None:
    """The file's row for each of the model's `rows` rows of `key` where the converter permuted
    them (a llama q or k projection: each head's rows interleaved in pairs), else None."""
    if not ARCHITECTURES.get(architecture(gguf)):
        return None
    count = heads if key.endswith("q_proj.weight") else kv_heads if key.endswith("k_proj.weight") else None
    if count is None:
        return None
    return torch.arange(rows).view(count, rows // count // 2, 2).transpose(1, 2).reshape(rows)


def _blocks(tensor, block_bytes: int) -> torch.Tensor:
    """The tensor's raw blocks, [rows, blocks per row, block_bytes] uint8 (read into memory)."""
    rows = shape(tensor)[0]
    data = np.ascontiguousarray(tensor.data, dtype=np.uint8).reshape(rows, -1, block_bytes)
    return torch.from_numpy(data)


def _half(raw: torch.Tensor) -> torch.Tensor:
    """Two bytes per entry (the last axis) as fp16."""
    return raw.contiguous().view(torch.float16).squeeze(-1)


def int4_blocks(tensor) -> Int4Blocks | None:
    """A Q4_0 / Q4_1 / Q4_K tensor's codes and scales as they are (None for another type)."""
    type_ = type_name(tensor)
    if type_ not in INT4_TYPES:
        return None
    rows, inputs = shape(tensor)
    if type_ == "Q4_0":                       # d fp16, 16 bytes: low nibbles inputs 0-15, high 16-31
        raw = _blocks(tensor, 18)
        d = _half(raw[..., 0:2])
        codes = _nibbles(raw[..., 2:18], 1)
        minimum = d * -8                      # exact: a power of two (checked below for overflow)
        if not torch.isfinite(minimum).all():
            return None
        return Int4Blocks(codes.reshape(rows, inputs), d, minimum)
    if type_ == "Q4_1":                       # d, m fp16, 16 bytes as Q4_0
        raw = _blocks(tensor, 20)
        codes = _nibbles(raw[..., 4:20], 1)
        return Int4Blocks(codes.reshape(rows, inputs), _half(raw[..., 0:2]), _half(raw[..., 2:4]))
    # Q4_K: d, dmin fp16, 12 bytes of 6-bit sc/m, 128 bytes of codes
    from gguf.quants import Q4_K

    raw = _blocks(tensor, 144)
    d, dmin = _half(raw[..., 0:2]).float(), _half(raw[..., 2:4]).float()
    sc, m = (torch.from_numpy(np.ascontiguousarray(a)).float().view(rows, -1, 8)
             for a in Q4_K.get_scale_min(raw[..., 4:16].reshape(-1, 12).numpy()))
    codes = _nibbles(raw[..., 16:144], 4)           # 4 runs of 64: low nibbles 32 inputs, high 32
    scale = (d[..., None] * sc).reshape(rows, -1)
    minimum = -(dmin[..., None] * m).reshape(rows, -1)
    return Int4Blocks(codes.reshape(rows, inputs), scale, minimum)


def _nibbles(raw: torch.Tensor, runs: int) -> torch.Tensor:
    """Codes of blocks whose bytes hold `runs` runs of 2·n inputs: byte i the i-th input of the run
    in its low nibble and the (n + i)-th in its high one. [rows, blocks, inputs per block] uint8."""
    rows, blocks, size = raw.shape
    run = raw.reshape(rows, blocks, runs, size // runs)
    return torch.stack((run & 0xF, run >> 4), dim=3).reshape(rows, blocks, -1)


def int8_blocks(tensor) -> Int8Blocks | None:
    """A Q8_0 tensor's codes and scales as they are (None for another type)."""
    if type_name(tensor) != "Q8_0":
        return None
    rows, inputs = shape(tensor)
    raw = _blocks(tensor, 34)
    return Int8Blocks(raw[..., 2:34].contiguous().view(torch.int8).reshape(rows, inputs), _half(raw[..., 0:2]))


CHUNK_ROWS = 4096      # rows dequantized at a time: gguf-py's temporaries for a whole 8B embedding: GBs


def dequantized(tensor) -> torch.Tensor:
    """The tensor's numbers in fp32, in torch's shape (gguf-py's dequantize, in row chunks)."""
    from gguf.quants import dequantize

    data = tensor.data
    out = torch.empty(shape(tensor), dtype=torch.float32)
    if data.ndim < 2:
        out.copy_(torch.from_numpy(np.array(dequantize(data, tensor.tensor_type), dtype=np.float32)).reshape(out.shape))
        return out
    for start in range(0, data.shape[0], CHUNK_ROWS):
        values = dequantize(data[start:start + CHUNK_ROWS], tensor.tensor_type)
        out[start:start + CHUNK_ROWS] = torch.from_numpy(np.array(values, dtype=np.float32)).reshape(-1, *out.shape[1:])
    return out


def stored_names(directory: Path) -> tuple[object, dict[str, str]] | None:
    """(reader, {tensor name: parameter key}) of a GGUF-backed base directory (its config.json
    names the model), or None where the directory holds no GGUF file or its names do not map."""
    path = Path(directory) / FILENAME
    if not path.is_file():
        return None
    from transformers import AutoConfig

    gguf = reader(path)
    names = parameter_names(gguf, parameter_keys(AutoConfig.from_pretrained(directory)))
    return (gguf, names) if names is not None else None


def parameter_keys(config) -> list[str]:
    """The parameter names of the model `config` describes (built on the meta device: no bytes)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return [k for k, _ in AutoModelForCausalLM.from_config(config).named_parameters()]


def shapes(path: Path) -> list[tuple[int, ...]]:
    """Every tensor's shape (torch's order), from the file's tensor table."""
    return [shape(t) for t in reader(path).tensors]
