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
import threading
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


class Reading:
    """A resident file being read on a thread of its own, so that the read (a 1.7B base: 1.4 GB)
    overlaps the import of transformers' model code and the tokenizer's load (about 3 s of
    Python that holds the GIL; a file read releases it). Where no thread can start, it reads
    when asked for its result."""

    def __init__(self, path: Path, key: dict[str, str]):
        self._path, self._key, self._contents = path, key, None
        self._thread = threading.Thread(target=self._read, name="zenedge-resident-read", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:
            self._thread = None

    def _read(self):
        try:
            self._contents = _read(self._path, self._key)
        except (OSError, InvalidAdapter, ValueError, KeyError, TypeError):
            self._contents = None        # unreadable, truncated or foreign: quantize from the source instead

    def result(self) -> "_Contents | None":
        if self._thread is None:
            self._read()
        else:
            self._thread.join()
        return self._contents


def start_reading(cache: ResidentCache, fmt: str, dtype: torch.dtype) -> Reading | None:
    """Start reading the base's resident file for this key; None where there is none."""
    path = cache.path(fmt)
    return Reading(path, cache.key(fmt, dtype)) if path.is_file() else None


def load(model: nn.Module, reading: Reading | None) -> dict[str, cpu_weights.CpuWeight] | None:
    """Fill `model` (built on the meta device and patched: quantized_load) from the resident file
    `reading` read: its parameters set, each VariantLinear's copy attached. Returns {module name:
    copy} for every copy in the file (the head's too, which convert_model wraps), or None where
    the file is not valid for this key or this model; the model is then untouched."""
    contents = reading.result() if reading is not None else None
    if contents is None:
        return None
    modules = dict(model.named_modules())
    params = {name for name, _ in model.named_parameters()}
    if not set(contents.copies) <= set(modules) or not set(contents.plain) <= params:
        return None
    for key, tensor in contents.plain.items():
        owner, _, attr = key.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, attr, nn.Parameter(tensor, requires_grad=False))
    for name, copy in contents.copies.items():
        if isinstance(modules[name], VariantLinear):
            modules[name].fast = copy
    return contents.copies


@dataclass
class _Contents:
    copies: dict[str, cpu_weights.CpuWeight]     # {module name: its copy}
    plain: dict[str, torch.Tensor]               # {parameter name: its tensor}


def _read(path: Path, key: dict[str, str]) -> _Contents | None:
    header = read_header(path)
    metadata, entries = header.metadata, header.tensors
    if any(metadata.get(k) != v for k, v in key.items()):
        return None
    layout = json.loads(metadata["copies"])
    copy_keys = {f"{name}.fast.{field}" for name, info in layout.items() for field in _COPIES[info["class"]].TENSORS}
    if not copy_keys <= set(entries):
        return None
    with open(path, "rb") as f:
        copies = _read_copies(f, layout, entries)
        plain = {name: read_tensor(f, entries[name]) for name in set(entries) - copy_keys}
    return _Contents(copies, plain)


def _read_copies(f, layout: dict, entries: dict[str, TensorInfo]) -> dict[str, cpu_weights.CpuWeight]:
    """The copies, read straight into the block of 2 MB pages `settle` would move them to, each
    q/k/v and gate/up group as one stacked copy whose parts are views of it: no copy is moved
    after the read (that move took 1.5 s of a 1.7B base's load)."""
    owners = _owners(layout, entries)
    specs = []
    for names in owners:
        for field in _COPIES[layout[names[0]]["class"]].TENSORS:
            parts = [entries[f"{name}.fast.{field}"] for name in names]
            specs.append(((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), _NAMED[parts[0].dtype]))
    block = cpu_weights.settled_block(specs)
    places = iter(block or [torch.empty(shape, dtype=dtype) for shape, dtype in specs])
    copies = {}
    for names in owners:
        cls = _COPIES[layout[names[0]]["class"]]
        whole = {field: next(places) for field in cls.TENSORS}
        at = dict.fromkeys(cls.TENSORS, 0)
        for name in names:
            views = {}
            for field in cls.TENSORS:
                entry = entries[f"{name}.fast.{field}"]
                views[field] = whole[field][at[field]:at[field] + entry.shape[0]]
                at[field] += entry.shape[0]
                _read_into(f, entry, views[field])
            copies[name] = cls.from_tensors(views, layout[name]["rows"], layout[name]["inputs"])
        parts = [copies[name] for name in names]
        if len(parts) > 1:
            stacked = cls.from_tensors(whole, sum(layout[name]["rows"] for name in names), layout[names[0]]["inputs"])
            cpu_weights.adopt_stacked(stacked, parts)
            parts = [stacked]
        for copy in parts:
            copy.settled = block is not None
    return copies


def _owners(layout: dict, entries: dict[str, TensorInfo]) -> list[tuple[str, ...]]:
    """The copies as `settle` would hold them: each stackable group's names (int4 parts of equal
    inputs and scale dtype: cpu_weights.stacked), then every other copy's name alone."""
    owners, grouped = [], set()
    for names in cpu_weights.stack_groups(layout):
        infos = [layout[name] for name in names]
        if all(info["class"] == "NativeInt4Weight" for info in infos) \
                and len({info["inputs"] for info in infos}) == 1 \
                and len({entries[f"{name}.fast.scale"].dtype for name in names}) == 1:
            owners.append(tuple(names))
            grouped.update(names)
    return owners + [(name,) for name in layout if name not in grouped]


def read_tensor(f, info: TensorInfo) -> torch.Tensor:
    """One tensor (`info` from adapters.safetensors_file.read_header) read into fresh memory. A
    read, not a mapping: mapped file pages count in the process's RSS for as long as any tensor
    views them (8B: 10 GiB at the peak when the copies were mapped, then moved)."""
    t = torch.empty(info.shape, dtype=_NAMED[info.dtype])
    _read_into(f, info, t)
    return t


def _read_into(f, info: TensorInfo, t: torch.Tensor) -> None:
    if list(t.shape) != list(info.shape) or t.dtype != _NAMED[info.dtype] or t.numel() * t.element_size() != info.end - info.begin:
        raise ValueError("a tensor's entry does not match its bytes")
    f.seek(info.begin)
    if f.readinto(memoryview(t.view(-1).view(torch.uint8).numpy())) != info.end - info.begin:
        raise ValueError("the file ended early")


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
