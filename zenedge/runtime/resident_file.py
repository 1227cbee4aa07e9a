"""A base's resident form on disk: the int4/int8 copies the kernels multiply with, and the few
plain tensors (embeddings, norms, biases), so that a load reads them instead of quantizing the
source checkpoint again.

Quantizing a 1.7B base from its bf16 safetensors takes tens of seconds (every weight read,
widened to fp32, grouped, rounded, laid out); reading back the finished layout is a copy at disk
or page-cache speed. The file sits in the base's directory (`resident/<format>.safetensors`,
beside the source checkpoint it came from) and is a plain safetensors file: one entry per tensor
of each copy (`<module>.fast.<tensor>`, in the kernels' own layout) and per resident parameter,
its metadata naming each copy's class and shape. It is made on the first load, written to a
temporary file and renamed (a crash leaves the old file or none), and is valid only for the
key it records: the source's identity, the model dtype, the format and LAYOUT (bumped whenever
a kernel's layout changes). Anything else, or a file that does not read back whole, is ignored
and rebuilt: the file is a cache of the source, never the only copy of anything.

Only the C kernels' copies (NativeInt4Weight, NativeInt8Weight) are written: their layout is
zenedge's own. Where a linear fell back to torch's packed formats (whose layout is torch's
business), no file is written and every load quantizes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from zenedge.adapters.safetensors_file import TensorInfo, read_header
from zenedge.errors import InvalidAdapter
from zenedge.runtime import cpu_weights
from zenedge.runtime.layers import FastLinear, VariantLinear

LAYOUT = "zenedge-resident/1"
_COPIES = {cls.__name__: cls for cls in (cpu_weights.NativeInt4Weight, cpu_weights.NativeInt8Weight)}
_DTYPES = {torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
           torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64", torch.bool: "BOOL"}
_NAMED = {name: dtype for dtype, name in _DTYPES.items()}
READABLE = frozenset(_NAMED)       # safetensors dtypes `read_tensor` takes
_ALIGN = 64


@dataclass(frozen=True)
class ResidentCache:
    """Where a base's resident files live and what they must have been made from."""

    directory: Path
    source: str          # the source checkpoint's identity (its weights_sha256)

    def path(self, fmt: str) -> Path:
        return self.directory / f"{fmt}.safetensors"

    def key(self, fmt: str, dtype: torch.dtype) -> dict[str, str]:
        return {"layout": LAYOUT, "source": self.source, "format": fmt, "dtype": str(dtype).removeprefix("torch.")}


def copies_of(model: nn.Module) -> dict[str, cpu_weights.CpuWeight]:
    """{module name: its fast copy} of every VariantLinear and FastLinear that has one."""
    return {name: m.fast for name, m in model.named_modules()
            if isinstance(m, (VariantLinear, FastLinear)) and m.fast is not None}


def save(model: nn.Module, cache: ResidentCache, fmt: str, dtype: torch.dtype) -> Path | None:
    """Write the model's resident form; None (nothing written) where a copy is not one of the C
    kernels' or the directory cannot be written (a read-only store: the next load quantizes)."""
    copies = copies_of(model)
    if not copies or any(type(c).__name__ not in _COPIES for c in copies.values()):
        return None
    tensors, layout = {}, {}
    for name, copy in copies.items():
        layout[name] = {"class": type(copy).__name__, "rows": copy.rows, "inputs": copy.inputs}
        tensors.update((f"{name}.fast.{field}", getattr(copy, field)) for field in copy.TENSORS)
    # named as in the model before convert_model wrapped its head (what `load` fills)
    heads = tuple(f"{name}.base." for name, m in model.named_modules() if isinstance(m, FastLinear))
    for name, p in model.named_parameters():
        if p.device.type != "meta":
            head = next((h for h in heads if name.startswith(h)), None)
            tensors[name if head is None else head.removesuffix("base.") + name[len(head):]] = p.detach()
    metadata = {**cache.key(fmt, dtype), "copies": json.dumps(layout, sort_keys=True)}
    path = cache.path(fmt)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, tensors, metadata)
    except OSError:
        return None
    return path


def load(model: nn.Module, cache: ResidentCache, fmt: str, dtype: torch.dtype) -> dict[str, cpu_weights.CpuWeight] | None:
    """Fill `model` (built on the meta device and patched: quantized_load) from its resident file:
    its parameters set, each VariantLinear's copy attached. Returns {module name: copy} for every
    copy in the file (the head's too, which convert_model wraps), or None where there is no valid
    file for this key; the model is then untouched."""
    path = cache.path(fmt)
    if not path.is_file():
        return None
    try:
        header = read_header(path)
        metadata, entries = header.metadata, header.tensors
        with open(path, "rb") as f:
            if any(metadata.get(k) != v for k, v in cache.key(fmt, dtype).items()):
                return None
            layout = json.loads(metadata["copies"])
            modules = dict(model.named_modules())
            params = {name for name, _ in model.named_parameters()}
            keys = set(entries)
            copy_keys = {f"{name}.fast.{field}" for name, info in layout.items()
                         for field in _COPIES[info["class"]].TENSORS}
            if not copy_keys <= keys or not set(layout) <= set(modules) or not keys - copy_keys <= params:
                return None
            copies = {name: _COPIES[info["class"]].from_tensors(
                          {field: read_tensor(f, entries[f"{name}.fast.{field}"]) for field in _COPIES[info["class"]].TENSORS},
                          info["rows"], info["inputs"])
                      for name, info in layout.items()}
            plain = {key: read_tensor(f, entries[key]) for key in keys - copy_keys}
    except (OSError, InvalidAdapter, ValueError, KeyError, TypeError):
        return None                 # unreadable, truncated or foreign: quantize from the source instead
    for key, tensor in plain.items():
        owner, _, attr = key.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, attr, nn.Parameter(tensor, requires_grad=False))
    for name, copy in copies.items():
        if isinstance(modules[name], VariantLinear):
            modules[name].fast = copy
    return copies


def read_tensor(f, info: TensorInfo) -> torch.Tensor:
    """One tensor (`info` from adapters.safetensors_file.read_header) read into fresh memory. A
    read, not a mapping: mapped file pages count in the process's RSS for as long as any tensor
    views them, and the copies are moved into huge pages right after (convert_model), so a
    mapping would only double the load's peak (8B: 10 GiB)."""
    dtype, shape, begin, end = _NAMED[info.dtype], info.shape, info.begin, info.end
    t = torch.empty(shape, dtype=dtype)
    f.seek(begin)
    if f.readinto(memoryview(t.view(-1).view(torch.uint8).numpy())) != end - begin:
        raise ValueError("the file ended early")
    return t


def _write(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A safetensors file written tensor by tensor (no second copy of the model in memory: the
    library's writer serialises the whole dict first), the data 64-byte aligned, tmp then rename."""
    header, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = metadata
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-(8 + len(encoded)) % _ALIGN)            # the format allows trailing spaces
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(len(encoded).to_bytes(8, "little") + encoded)
            for t in tensors.values():
                out.write(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
