"""`zenedge registry build DIR`: write index.json and one manifest.json per profile folder.

A profile folder holds either a PEFT LoRA adapter (`adapter/` with adapter_config.json and
adapter_model.safetensors, or those two files directly) or a BitDelta file (`delta.safetensors`),
optionally `eval.jsonl` and `recipe.json` (name, version, description, license, metric, base,
and the recipe that produced it). The result can be served by any static file server.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from zenedge.bases import DEFAULT_BASE, DEFAULT_BASE_SHA256, file_sha256
from zenedge.errors import InvalidInput
from zenedge.names import check_name
from zenedge.registry.manifest import INDEX_FORMAT, FileEntry, Manifest

DELTA_NAMES = ("delta.safetensors", "bitdelta.safetensors")


def _entry(folder: Path, path: Path, role: str) -> FileEntry:
    return FileEntry(path.relative_to(folder).as_posix(), file_sha256(path), path.stat().st_size, role)


def _find_lora(folder: Path) -> tuple[Path, Path] | None:
    for candidate in (folder / "adapter", folder):
        config, weights = candidate / "adapter_config.json", candidate / "adapter_model.safetensors"
        if config.is_file() and weights.is_file():
            return config, weights
    return None


def build_manifest(folder: Path, default_base: tuple[str, str] = (DEFAULT_BASE, DEFAULT_BASE_SHA256)) -> Manifest:
    recipe_path = folder / "recipe.json"
    info: dict[str, Any] = json.loads(recipe_path.read_text()) if recipe_path.is_file() else {}
    name = check_name(info.get("name", folder.name), "profile name")
    lora = _find_lora(folder)
    delta = next((folder / n for n in DELTA_NAMES if (folder / n).is_file()), None)
    if lora:
        kind, files = "lora", (_entry(folder, lora[0], "config"), _entry(folder, lora[1], "weights"))
    elif delta:
        kind, files = "bitdelta", (_entry(folder, delta, "weights"),)
    else:
        raise InvalidInput(f"{folder}: no PEFT adapter (adapter/adapter_config.json + adapter_model.safetensors) "
                           f"and no {' / '.join(DELTA_NAMES)}")
    declared = info.get("kind")
    if declared and declared != kind:
        raise InvalidInput(f"{folder}: recipe.json says kind {declared!r} but the files are {kind!r}")
    eval_path = folder / "eval.jsonl"
    base = info.get("base") if isinstance(info.get("base"), dict) else {}
    if base.get("name", default_base[0]) == default_base[0]:
        base = {"name": default_base[0], "sha256": default_base[1]}  # the canonical identity (the GGUF)
    return Manifest(
        name=name, version=str(info.get("version", "1.0.0")), description=str(info.get("description", "")),
        kind=kind, base_name=base.get("name", default_base[0]), base_sha256=base.get("sha256", default_base[1]),
        files=files, eval=_entry(folder, eval_path, "eval") if eval_path.is_file() else None,
        eval_metric=str(info.get("metric", "loss")), license=str(info.get("license", "")),
        recipe=info.get("recipe", {}) if isinstance(info.get("recipe"), dict) else {},
    )


def _write_json(path: Path, value: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as handle:
        json.dump(value, handle, indent=2, sort_keys=False)
        handle.write("\n")
    os.replace(tmp, path)


def build_registry(root: Path, progress: Callable[[str], None] | None = None) -> list[Manifest]:
    root = Path(root)
    if not root.is_dir():
        raise InvalidInput(f"{root}: not a directory")
    built: list[tuple[str, Manifest]] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        if not (_find_lora(folder) or any((folder / n).is_file() for n in DELTA_NAMES)):
            continue  # recipes, docs and the like
        manifest = build_manifest(folder)
        _write_json(folder / "manifest.json", manifest.to_json())
        built.append((folder.name, manifest))
        if progress:
            progress(f"{manifest.name} {manifest.version} ({manifest.kind}, {manifest.size} bytes)")
    names = [m.name for _, m in built]
    if len(set(names)) != len(names):
        raise InvalidInput(f"{root}: two folders declare the same profile name")
    _write_json(root / "index.json", {"format": INDEX_FORMAT, "profiles": [
        {"name": m.name, "version": m.version, "kind": m.kind, "description": m.description, "size": m.size,
         "base": m.base_name, "manifest": f"{folder}/manifest.json"} for folder, m in built]})
    return [m for _, m in built]
