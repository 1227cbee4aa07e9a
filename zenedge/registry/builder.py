"""`zenedge registry build DIR`: write index.json and one manifest.json per profile folder.

A profile folder holds either a PEFT LoRA adapter (`adapter/` with adapter_config.json and
adapter_model.safetensors, or those two files directly) or a BitDelta file (`delta.safetensors`),
optionally `eval.jsonl`, `recipe.json` (name, version, description, license, metric, base,
and the recipe that produced it) and `anchors.json` (the eval set's per-example base and own
losses, written by `zenedge registry build --anchors`; embedded in the manifest while it matches
the eval set and the base). The result can be served by any static file server.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from zenedge.bases import DEFAULT_BASE, DEFAULT_BASE_SHA256
from zenedge.digests import file_sha256
from zenedge.errors import InvalidInput
from zenedge.names import check_name
from zenedge.registry.manifest import INDEX_FORMAT, FileEntry, Manifest, parse_anchors

DELTA_NAMES = ("delta.safetensors", "bitdelta.safetensors")
ANCHORS_FILE = "anchors.json"
ANCHORS_FORMAT = "zenedge-anchors/1"


def _entry(folder: Path, path: Path, role: str) -> FileEntry:
    return FileEntry(path.relative_to(folder).as_posix(), file_sha256(path), path.stat().st_size, role)


def find_lora(folder: Path) -> tuple[Path, Path] | None:
    for candidate in (folder / "adapter", folder):
        config, weights = candidate / "adapter_config.json", candidate / "adapter_model.safetensors"
        if config.is_file() and weights.is_file():
            return config, weights
    return None


def build_manifest(folder: Path, default_base: tuple[str, str] = (DEFAULT_BASE, DEFAULT_BASE_SHA256)) -> Manifest:
    recipe_path = folder / "recipe.json"
    info: dict[str, Any] = json.loads(recipe_path.read_text()) if recipe_path.is_file() else {}
    name = check_name(info.get("name", folder.name), "profile name")
    lora = find_lora(folder)
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
    evaluation = _entry(folder, eval_path, "eval") if eval_path.is_file() else None
    base_sha256 = base.get("sha256", default_base[1])
    return Manifest(
        name=name, version=str(info.get("version", "1.0.0")), description=str(info.get("description", "")),
        kind=kind, base_name=base.get("name", default_base[0]), base_sha256=base_sha256,
        files=files, eval=evaluation,
        eval_metric=str(info.get("metric", "loss")), license=str(info.get("license", "")),
        recipe=info.get("recipe", {}) if isinstance(info.get("recipe"), dict) else {},
        eval_anchors=current_anchors(folder, evaluation, base_sha256),
    )


def current_anchors(folder: Path, evaluation: FileEntry | None, base_sha256: str) -> dict[str, Any] | None:
    """The folder's anchors.json when it was measured on this eval set and base (else None: stale
    anchors are left out, and a pull measures them itself)."""
    path = folder / ANCHORS_FILE
    if evaluation is None or not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if (saved.get("format") != ANCHORS_FORMAT or saved.get("eval_sha256") != evaluation.sha256
            or saved.get("base_sha256") != base_sha256):
        return None
    return parse_anchors(saved, str(path))


def write_anchors(folder: Path, anchors: dict[str, Any], eval_sha256: str, base_sha256: str) -> None:
    _write_json(folder / ANCHORS_FILE, {"format": ANCHORS_FORMAT, "eval_sha256": eval_sha256,
                                        "base_sha256": base_sha256, **parse_anchors(anchors, str(folder))})


def _write_json(path: Path, value: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as handle:
        json.dump(value, handle, indent=2, sort_keys=False)
        handle.write("\n")
    os.replace(tmp, path)


def profile_folders(root: Path) -> list[Path]:
    """The folders of `root` that hold a profile (not recipes, docs and the like)."""
    return [folder for folder in sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
            if find_lora(folder) or any((folder / n).is_file() for n in DELTA_NAMES)]


def build_registry(root: Path, progress: Callable[[str], None] | None = None) -> list[Manifest]:
    root = Path(root)
    if not root.is_dir():
        raise InvalidInput(f"{root}: not a directory")
    built: list[tuple[str, Manifest]] = []
    for folder in profile_folders(root):
        manifest = build_manifest(folder)
        _write_json(folder / "manifest.json", manifest.to_json())
        built.append((folder.name, manifest))
        if progress:
            anchors = ", anchors" if manifest.eval_anchors else ""
            progress(f"{manifest.name} {manifest.version} ({manifest.kind}, {manifest.size} bytes{anchors})")
    names = [m.name for _, m in built]
    if len(set(names)) != len(names):
        raise InvalidInput(f"{root}: two folders declare the same profile name")
    _write_json(root / "index.json", {"format": INDEX_FORMAT, "profiles": [
        {"name": m.name, "version": m.version, "kind": m.kind, "description": m.description, "size": m.size,
         "base": m.base_name, "manifest": f"{folder}/manifest.json"} for folder, m in built]})
    return [m for _, m in built]
