"""Compress a fine-tuned checkpoint against its base into one .bitdelta file, tensor by tensor.

Projections (2-D ``*.weight`` under ``layers.``: q/k/v/o/gate/up/down_proj and friends) become
packed signs + per-row alpha of Δ = W_ft − W_base. Every other tensor (embeddings, lm_head,
norms, biases) is stored in full only where it differs from the base. Both checkpoints are read
through ``safetensors.safe_open``, one tensor at a time, so peak memory is about one layer.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open

from zenedge.digests import checkpoint_sha256

from .errors import CheckpointMismatch
from .fileformat import FORMAT_NAME, FORMAT_VERSION, SafetensorsStreamWriter, module_entry
from .packing import compress, unpack_signs

_PROJECTION = re.compile(r"(^|\.)layers\.\d+\..+\.weight$")

ProgressFn = Callable[[int, int, str], None]          # (done, total, tensor name)


@dataclass(frozen=True)
class CompressionReport:
    out_path: Path
    modules_compressed: int
    extra_tensors: int            # non-projection tensors stored in full (they changed)
    bytes_full_delta: int         # dense Δ of the projections, in the fine-tuned dtype
    bytes_bitdelta: int           # packed signs + alphas
    bytes_extra: int              # full tensors stored
    ratio: float                  # bytes_full_delta / bytes_bitdelta
    mean_relative_error: float    # mean over modules of ‖Δ − α⊙S‖ / ‖Δ‖
    file_bytes: int


def is_projection(name: str, shape: tuple[int, ...]) -> bool:
    """A linear weight inside a decoder layer: the tensors BitDelta compresses."""
    return len(shape) == 2 and bool(_PROJECTION.search(name))


class _Checkpoint:
    """Name -> shard map over a Hugging Face safetensors directory (single file or sharded)."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.files = sorted(self.dir.glob("*.safetensors"))
        if not self.files:
            raise CheckpointMismatch(f"{self.dir}: no .safetensors files")
        self._handles = {}
        self.where: dict[str, Path] = {}
        for file in self.files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    self.where[name] = file

    def _handle(self, file: Path):
        if file not in self._handles:
            self._handles[file] = safe_open(str(file), framework="pt").__enter__()
        return self._handles[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self.where[name]).get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        return self._handle(self.where[name]).get_tensor(name)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.__exit__(None, None, None)
        self._handles.clear()


class _GgufCheckpoint:
    """_Checkpoint's reads from a base stored as its GGUF file (zenedge/gguf_file.py): each tensor
    dequantized on its own, named and with its rows ordered as in the model (a layer at a time,
    never the whole model in fp32)."""

    def __init__(self, directory: Path):
        from zenedge import gguf_file

        stored = gguf_file.stored_names(directory)
        if stored is None:
            raise CheckpointMismatch(f"{directory}: its GGUF file's tensors do not name the model's parameters")
        self.table, names = stored
        self.files = [Path(directory) / gguf_file.FILENAME]
        self.where = {names[t.name]: t for t in self.table.tensors if t.name in names}
        config = json.loads((Path(directory) / "config.json").read_text())
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads") or self.heads

    def shape(self, name: str) -> tuple[int, ...]:
        from zenedge import gguf_file

        return gguf_file.shape(self.where[name])

    def get(self, name: str) -> torch.Tensor:
        from zenedge import gguf_file

        weight = gguf_file.dequantized(self.where[name])
        order = gguf_file.row_order(self.table, name, weight.shape[0], self.heads, self.kv_heads)
        return weight[order] if order is not None else weight

    def close(self) -> None:
        pass


def _checkpoint(directory: str | os.PathLike):
    """A checkpoint directory's reader: safetensors, or a base stored as its GGUF file."""
    from zenedge.gguf_file import FILENAME

    if (Path(directory) / FILENAME).is_file() and not any(Path(directory).glob("*.safetensors")):
        return _GgufCheckpoint(Path(directory))
    return _Checkpoint(directory)


def _relative_error(delta: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor) -> float:
    norm = float(delta.norm())
    if norm == 0.0:
        return 0.0
    approx = unpack_signs(packed, delta.shape[1]) * alpha[:, None]
    return float((delta - approx).norm()) / norm


def compress_model(base_dir: str | os.PathLike, finetuned_dir: str | os.PathLike, out_path: str | os.PathLike, *,
                   progress: ProgressFn | None = None, base_sha256: str | None = None) -> CompressionReport:
    """Write ``out_path`` (.bitdelta safetensors) holding ``finetuned − base``; see the module doc."""
    base, tuned = _checkpoint(base_dir), _Checkpoint(finetuned_dir)
    writer = SafetensorsStreamWriter(out_path)
    try:
        modules, extras, errors = [], [], []
        bytes_full = bytes_bits = bytes_extra = 0
        source_dtypes = set()
        names = sorted(tuned.where)
        for done, name in enumerate(names, 1):
            ft_shape = tuned.shape(name)
            if is_projection(name, ft_shape):
                if name not in base.where:
                    raise CheckpointMismatch(f"projection {name} is missing from the base checkpoint")
                if base.shape(name) != ft_shape:
                    raise CheckpointMismatch(f"{name}: base shape {base.shape(name)} != fine-tuned {ft_shape}")
                w_ft = tuned.get(name)
                delta = w_ft.float() - base.get(name).float()                     # [out, in] fp32
                packed, alpha = compress(delta)
                module = name[: -len(".weight")]
                bytes_bits += writer.add(module + ".packed", packed) + writer.add(module + ".alpha", alpha)
                bytes_full += delta.numel() * w_ft.element_size()
                source_dtypes.add(str(w_ft.dtype).removeprefix("torch."))
                errors.append(_relative_error(delta, packed, alpha))
                modules.append(module_entry(module, ft_shape[1], ft_shape[0]))
                del w_ft, delta
            else:
                tensor = tuned.get(name)
                if name not in base.where or base.shape(name) != ft_shape or not torch.equal(tensor, base.get(name)):
                    bytes_extra += writer.add(name, tensor)
                    extras.append(name)
            if progress is not None:
                progress(done, len(names), name)
        metadata = {
            "format": FORMAT_NAME,
            "format_version": str(FORMAT_VERSION),
            "base_sha256": base_sha256 or checkpoint_sha256(base.files),
            "modules": json.dumps(modules),
            "extra": json.dumps(extras),
            "source_dtype": ",".join(sorted(source_dtypes)),
            "bytes_full_delta": str(bytes_full),
            "bytes_bitdelta": str(bytes_bits),
            "bytes_extra": str(bytes_extra),
        }
        path = writer.finish(metadata)
    except BaseException:
        writer.close()
        raise
    finally:
        base.close()
        tuned.close()
    return CompressionReport(
        out_path=path, modules_compressed=len(modules), extra_tensors=len(extras),
        bytes_full_delta=bytes_full, bytes_bitdelta=bytes_bits, bytes_extra=bytes_extra,
        ratio=bytes_full / bytes_bits if bytes_bits else 0.0,
        mean_relative_error=sum(errors) / len(errors) if errors else 0.0,
        file_bytes=path.stat().st_size,
    )
