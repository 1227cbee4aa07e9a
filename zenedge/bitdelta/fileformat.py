"""The .bitdelta file: one safetensors file with packed signs, alphas and changed full tensors.

Tensors:   ``<module>.packed`` uint8 [out, ceil(in/8)], ``<module>.alpha`` float32 [out],
           ``<param>`` full tensors for changed non-projection parameters.
Metadata:  format, format_version, base_sha256, modules (JSON list of {name, in_features,
           out_features}), extra (JSON list of names), byte counts (see compressor.py).

The writer streams: tensors go to a body file one at a time, then the header and body are
joined into the final file (temp + fsync + rename), so peak memory is one tensor, never the
whole output.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from .errors import (BadDtype, BitDeltaFormatError, InconsistentShapes, MissingTensor, NonFiniteAlpha,
                     UnknownFormatVersion)
from .packing import packed_width

FORMAT_NAME = "zenedge.bitdelta"
FORMAT_VERSION = 1
KNOWN_VERSIONS = frozenset({1})

_ST_DTYPES = {
    torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
    torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64", torch.bool: "BOOL",
}
_COPY_CHUNK = 1 << 24


@dataclass
class BitDeltaFile:
    """A loaded, validated .bitdelta file."""

    modules: dict[str, tuple[torch.Tensor, torch.Tensor, int]]    # name -> (packed, alpha, in_features)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)   # changed full tensors
    metadata: dict[str, str] = field(default_factory=dict)         # raw safetensors metadata

    @property
    def base_sha256(self) -> str:
        return self.metadata.get("base_sha256", "")


class SafetensorsStreamWriter:
    """Write a safetensors file tensor by tensor without holding them all in memory."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._body = tempfile.NamedTemporaryFile(dir=self.path.parent, prefix=".body-", delete=False)
        self._entries: dict[str, dict] = {}
        self._offset = 0

    def add(self, name: str, tensor: torch.Tensor) -> int:
        """Append one tensor; returns its byte size."""
        if name in self._entries or name == "__metadata__":
            raise ValueError(f"duplicate or reserved tensor name {name!r}")
        if tensor.dtype not in _ST_DTYPES:
            raise ValueError(f"dtype {tensor.dtype} of {name!r} cannot be stored")
        data = tensor.detach().to("cpu").contiguous()
        raw = data.reshape(-1).view(torch.uint8).numpy().tobytes()   # little-endian on x86/arm
        self._body.write(raw)
        self._entries[name] = {"dtype": _ST_DTYPES[data.dtype], "shape": list(data.shape),
                               "data_offsets": [self._offset, self._offset + len(raw)]}
        self._offset += len(raw)
        return len(raw)

    def finish(self, metadata: dict[str, str]) -> Path:
        """Join header and body into ``path`` atomically (temp file, fsync, rename, fsync dir)."""
        self._body.flush()
        header = dict(self._entries)
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)                               # 8-byte aligned data start
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-", suffix=".safetensors")
        try:
            with os.fdopen(fd, "wb") as out, open(self._body.name, "rb") as body:
                out.write(struct.pack("<Q", len(blob)))
                out.write(blob)
                while chunk := body.read(_COPY_CHUNK):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        finally:
            self.close()
        return self.path

    def close(self) -> None:
        self._body.close()
        if os.path.exists(self._body.name):
            os.unlink(self._body.name)


def module_entry(name: str, in_features: int, out_features: int) -> dict:
    return {"name": name, "in_features": in_features, "out_features": out_features}


def _parse_json(meta: dict[str, str], key: str, path: Path):
    if key not in meta:
        raise BitDeltaFormatError(f"{path}: metadata has no {key!r}")
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError as exc:
        raise BitDeltaFormatError(f"{path}: metadata {key!r} is not valid JSON ({exc.msg})") from None


def load_bitdelta(path: str | os.PathLike, device: str | torch.device = "cpu") -> BitDeltaFile:
    """Load and validate a .bitdelta file; raises BitDeltaFormatError subclasses on any defect."""
    path = Path(path)
    try:
        handle = safe_open(str(path), framework="pt", device=str(device))
    except Exception as exc:                                      # safetensors raises its own types
        raise BitDeltaFormatError(f"{path}: not a readable safetensors file ({exc})".replace("\n", " ")) from None
    with handle as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT_NAME:
            raise BitDeltaFormatError(f"{path}: format is {meta.get('format')!r}, expected {FORMAT_NAME!r}")
        try:
            version = int(meta.get("format_version", ""))
        except ValueError:
            raise UnknownFormatVersion(f"{path}: format_version {meta.get('format_version')!r} is not an integer") from None
        if version not in KNOWN_VERSIONS:
            raise UnknownFormatVersion(f"{path}: format_version {version} is unknown (known: {sorted(KNOWN_VERSIONS)})")
        names = set(f.keys())
        modules: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}
        for entry in _parse_json(meta, "modules", path):
            name, in_features = entry["name"], int(entry["in_features"])
            for suffix in (".packed", ".alpha"):
                if name + suffix not in names:
                    raise MissingTensor(f"{path}: module {name!r} has no {suffix[1:]!r} tensor")
            packed, alpha = f.get_tensor(name + ".packed"), f.get_tensor(name + ".alpha")
            _check_module(path, name, packed, alpha, in_features, entry.get("out_features"))
            modules[name] = (packed, alpha, in_features)
        extra = {}
        for name in _parse_json(meta, "extra", path):
            if name not in names:
                raise MissingTensor(f"{path}: extra tensor {name!r} is missing")
            extra[name] = f.get_tensor(name)
    return BitDeltaFile(modules=modules, extra=extra, metadata=dict(meta))


def _check_module(path, name, packed, alpha, in_features, out_features) -> None:
    if packed.dtype != torch.uint8:
        raise BadDtype(f"{path}: {name}.packed is {packed.dtype}, expected torch.uint8")
    if alpha.dtype != torch.float32:
        raise BadDtype(f"{path}: {name}.alpha is {alpha.dtype}, expected torch.float32")
    if packed.dim() != 2 or alpha.dim() != 1 or packed.shape[0] != alpha.shape[0]:
        raise InconsistentShapes(
            f"{path}: {name} packed {tuple(packed.shape)} and alpha {tuple(alpha.shape)} disagree")
    if in_features <= 0 or packed.shape[1] != packed_width(in_features):
        raise InconsistentShapes(
            f"{path}: {name} packed width {packed.shape[1]} does not fit in_features={in_features}")
    if out_features is not None and int(out_features) != packed.shape[0]:
        raise InconsistentShapes(f"{path}: {name} has {packed.shape[0]} rows, metadata says {out_features}")
    if not bool(torch.isfinite(alpha).all()):
        raise NonFiniteAlpha(f"{path}: {name}.alpha holds NaN or inf")


def save_bitdelta(path: str | os.PathLike, data: BitDeltaFile) -> Path:
    """Write a BitDeltaFile (e.g. with distilled alphas); keeps its metadata, refreshes the lists."""
    writer = SafetensorsStreamWriter(path)
    try:
        entries = []
        for name, (packed, alpha, in_features) in data.modules.items():
            writer.add(name + ".packed", packed)
            writer.add(name + ".alpha", alpha.to(torch.float32))
            entries.append(module_entry(name, in_features, packed.shape[0]))
        for name, tensor in data.extra.items():
            writer.add(name, tensor)
        meta = dict(data.metadata)
        meta.update(format=FORMAT_NAME, format_version=str(FORMAT_VERSION), modules=json.dumps(entries),
                    extra=json.dumps(list(data.extra)))
        return writer.finish(meta)
    except BaseException:
        writer.close()
        raise
