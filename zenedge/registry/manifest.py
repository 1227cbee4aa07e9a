"""The registry format: an index of profiles and one manifest per profile version.

    index.json                {"format": "zenedge-registry/1", "profiles": [IndexEntry, ...]}
    <name>/manifest.json      {"format": "zenedge-manifest/1", "name", "version", "description",
                               "kind": "lora" | "bitdelta", "base": {"name", "sha256"},
                               "files": [{"path", "sha256", "size", "role"}], "eval": {...} | null,
                               "license", "recipe": {...}}

A manifest's eval entry may carry `anchors`: the profile's base and own answer losses (and answer
tokens right) per eval example, as the quality gate reads them, measured once by the publisher
(`zenedge registry build --anchors`). A pull that has to merge then skips measuring them; the gate
re-measures a few examples before relying on them (pool/gate.py), since a registry is untrusted.

Paths in a manifest are relative to the manifest's folder and are validated strictly (no
absolute paths, no `..`, no backslashes) before anything touches the file system, because a
remote registry is untrusted input.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from zenedge.errors import InvalidInput, RegistryError
from zenedge.names import check_digest, check_name

INDEX_FORMAT = "zenedge-registry/1"
MANIFEST_FORMAT = "zenedge-manifest/1"
KINDS = ("lora", "bitdelta")
ROLES = ("config", "weights")
MAX_FILE_BYTES = 64 * 2**30
MAX_ANCHORS = 256
_PART = re.compile(r"[A-Za-z0-9._-]{1,128}")


def check_relative_path(path: str, where: str) -> str:
    """A safe relative POSIX path: every component a plain name, no `..`, no absolute path."""
    if not isinstance(path, str) or not path or len(path) > 512 or "\\" in path or path.startswith("/"):
        raise RegistryError(f"{where}: unsafe file path {str(path)[:80]!r}")
    parts = PurePosixPath(path).parts
    if any(p in ("..", ".") or not _PART.fullmatch(p) for p in parts):
        raise RegistryError(f"{where}: unsafe file path {path[:80]!r}")
    return "/".join(parts)


def version_key(version: str) -> tuple:
    """Order versions numerically where they are numbers ("1.10.0" > "1.9.0")."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.+-]", version))


@dataclass(frozen=True)
class FileEntry:
    path: str
    sha256: str
    size: int
    role: str = ""


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    description: str
    kind: str
    base_name: str
    base_sha256: str
    files: tuple[FileEntry, ...]
    eval: FileEntry | None
    eval_metric: str
    license: str
    recipe: dict[str, Any] = field(default_factory=dict)
    eval_anchors: dict[str, Any] | None = None

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files) + (self.eval.size if self.eval else 0)

    def file(self, role: str) -> FileEntry:
        for entry in self.files:
            if entry.role == role:
                return entry
        raise RegistryError(f"manifest for {self.name!r} has no {role} file")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT, "name": self.name, "version": self.version,
            "description": self.description, "kind": self.kind,
            "base": {"name": self.base_name, "sha256": self.base_sha256},
            "files": [vars(f) for f in self.files],
            "eval": ({**{k: v for k, v in vars(self.eval).items() if k != "role"}, "metric": self.eval_metric,
                      **({"anchors": self.eval_anchors} if self.eval_anchors else {})}
                     if self.eval else None),
            "license": self.license, "recipe": self.recipe,
        }


def _file_entry(raw: Any, where: str, role: str | None = None) -> FileEntry:
    if not isinstance(raw, dict):
        raise RegistryError(f"{where}: file entries must be objects")
    size = raw.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
        raise RegistryError(f"{where}: invalid size {size!r}")
    try:
        digest = check_digest(raw.get("sha256", ""))
    except InvalidInput:
        raise RegistryError(f"{where}: invalid sha256 {str(raw.get('sha256'))[:80]!r}") from None
    role = role if role is not None else raw.get("role", "")
    if role not in ROLES and role != "eval":
        raise RegistryError(f"{where}: unknown file role {role!r}")
    return FileEntry(check_relative_path(raw.get("path"), where), digest, size, role)


def parse_anchors(raw: Any, where: str) -> dict[str, Any]:
    """Per-example anchors, checked for shape only (their values are re-measured in part by the gate)."""
    if not isinstance(raw, dict):
        raise RegistryError(f"{where}: eval anchors must be an object")
    order, scorer = raw.get("order"), raw.get("scorer", "")
    if not isinstance(order, str) or not re.fullmatch(r"[0-9a-f]{16}", order) or not isinstance(scorer, str):
        raise RegistryError(f"{where}: eval anchors need an order (16 hex digits) and a scorer name")
    lists = {}
    for key, kind in (("base", float), ("own", float), ("base_hits", int), ("own_hits", int)):
        values = raw.get(key)
        if (not isinstance(values, list) or not 1 <= len(values) <= MAX_ANCHORS
                or not all(_anchor_value(v, kind) for v in values)):
            raise RegistryError(f"{where}: eval anchors {key!r} must be a list of 1 to {MAX_ANCHORS} "
                                f"non-negative {'numbers' if kind is float else 'whole numbers'}")
        lists[key] = [kind(v) for v in values]
    if len({len(v) for v in lists.values()}) != 1:
        raise RegistryError(f"{where}: eval anchors lists differ in length")
    return {"order": order, "scorer": scorer[:64], **lists}


def _anchor_value(value: Any, kind: type) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        return False
    return math.isfinite(value) and 0 <= value < 1e9


def parse_manifest(data: bytes | str, where: str) -> Manifest:
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RegistryError(f"{where}: manifest is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        raise RegistryError(f"{where}: not a zenedge manifest (format must be {MANIFEST_FORMAT!r})")
    try:
        name = check_name(raw.get("name"), "profile name")
    except InvalidInput as exc:
        raise RegistryError(f"{where}: {exc}") from None
    kind = raw.get("kind")
    if kind not in KINDS:
        raise RegistryError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    base = raw.get("base")
    if not isinstance(base, dict) or not isinstance(base.get("name"), str):
        raise RegistryError(f"{where}: base must be an object with a name and sha256")
    files = raw.get("files")
    if not isinstance(files, list) or not files or len(files) > 16:
        raise RegistryError(f"{where}: files must be a non-empty list")
    entries = tuple(_file_entry(f, where) for f in files)
    if len({e.path for e in entries}) != len(entries):
        raise RegistryError(f"{where}: duplicate file paths")
    evaluation = raw.get("eval")
    eval_entry = _file_entry(evaluation, where, role="eval") if evaluation else None
    anchors = evaluation.get("anchors") if isinstance(evaluation, dict) else None
    text = {k: raw.get(k, "") for k in ("version", "description", "license")}
    if not all(isinstance(v, str) and len(v) < 1000 for v in text.values()):
        raise RegistryError(f"{where}: version, description and license must be short strings")
    manifest = Manifest(
        name=name, version=text["version"] or "0", description=text["description"], kind=kind,
        base_name=base["name"], base_sha256=str(base.get("sha256", "")), files=entries, eval=eval_entry,
        eval_metric=str((evaluation or {}).get("metric", "loss")), license=text["license"],
        recipe=raw.get("recipe") if isinstance(raw.get("recipe"), dict) else {},
        eval_anchors=parse_anchors(anchors, where) if anchors is not None else None,
    )
    manifest.file("weights")
    if kind == "lora":
        manifest.file("config")
    return manifest


@dataclass(frozen=True)
class IndexEntry:
    name: str
    version: str
    kind: str
    description: str
    size: int
    base: str
    manifest: str  # relative path to the manifest


def parse_index(data: bytes | str, where: str) -> list[IndexEntry]:
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RegistryError(f"{where}: index is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != INDEX_FORMAT or not isinstance(raw.get("profiles"), list):
        raise RegistryError(f"{where}: not a zenedge registry index (format must be {INDEX_FORMAT!r})")
    entries = []
    for item in raw["profiles"]:
        if not isinstance(item, dict):
            raise RegistryError(f"{where}: index entries must be objects")
        try:
            name = check_name(item.get("name"), "profile name")
        except InvalidInput as exc:
            raise RegistryError(f"{where}: {exc}") from None
        size = item.get("size", 0)
        if size is None:
            size = 0  # the index's size is informational; the manifest's sizes are what downloads check
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES * 16:
            raise RegistryError(f"{where}: profile {name!r} has an invalid size {str(size)[:40]!r} "
                                "(a whole number of bytes)")
        entries.append(IndexEntry(
            name=name, version=str(item.get("version", "0")), kind=str(item.get("kind", "")),
            description=str(item.get("description", ""))[:500], size=size,
            base=str(item.get("base", "")), manifest=check_relative_path(item.get("manifest"), where),
        ))
    return entries
