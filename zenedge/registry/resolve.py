"""A reference (NAME[:VERSION]) resolved through the configured registries in order, and its
files fetched and verified into a staging folder (resuming partial downloads). What happens to
them next is the pool's business (zenedge.pool.pull)."""

from __future__ import annotations

import difflib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from zenedge.config import Config
from zenedge.errors import ProfileNotFound, RegistryError
from zenedge.names import split_reference
from zenedge.registry.manifest import FileEntry, IndexEntry, Manifest, version_key
from zenedge.registry.sources import open_source
from zenedge.store.owners import Downloads

Progress = Callable[[dict[str, Any]], None]


@dataclass
class Fetched:
    """A profile's files in staging, laid out for the pool's importer: `adapter` is a PEFT LoRA
    directory (PEFT's file names, whatever the registry calls them) or a .bitdelta file."""

    adapter: Path
    eval_path: Path | None


@dataclass
class Resolved:
    source: Any
    entry: IndexEntry
    manifest: Manifest
    folder: str

    @property
    def digests(self) -> list[str]:
        """Every file the profile needs, by digest (its weights, config and eval set)."""
        return [entry.sha256 for entry in self._files()]

    def _files(self) -> list[FileEntry]:
        return list(self.manifest.files) + ([self.manifest.eval] if self.manifest.eval else [])

    def fetch_into(self, staging: Path, downloads: Downloads, present: Callable[[str], Path | None],
                   report: Progress) -> Fetched:
        """Fetch and verify every file into `staging`. `present(digest)`: a local file that holds
        it already (copied, not transferred); a download goes through `downloads`' resumable
        `.part` file, which the caller owns (Downloads.claim)."""
        for entry in self._files():
            target = staging / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            local = present(entry.sha256)
            if local is not None:
                shutil.copyfile(local, target)
                report({"status": "present", "file": entry.path, "completed": entry.size, "total": entry.size})
                continue
            done = [0]

            def on_bytes(n: int, entry=entry, done=done) -> None:
                done[0] += n
                report({"status": "downloading", "file": entry.path, "completed": done[0], "total": entry.size})

            part = downloads.part(entry.sha256)
            self.source.fetch(self.folder, entry.path, part, sha256=entry.sha256, size=entry.size, progress=on_bytes)
            part.replace(target)
        manifest = self.manifest
        adapter = staging / manifest.file("weights").path
        if manifest.kind == "lora":
            peft_dir = staging / ".peft"
            peft_dir.mkdir()
            adapter = adapter.replace(peft_dir / "adapter_model.safetensors").parent
            (staging / manifest.file("config").path).replace(peft_dir / "adapter_config.json")
        return Fetched(adapter, staging / manifest.eval.path if manifest.eval else None)


def search(cfg: Config, text: str = "") -> list[dict[str, Any]]:
    """Profiles the configured registries offer (newest version of each name, first registry wins)."""
    seen: dict[str, dict[str, Any]] = {}
    for url in cfg.registry.urls:
        for entry in _index(url):
            if text and text.lower() not in f"{entry.name} {entry.description}".lower():
                continue
            current = seen.get(entry.name)
            if current is None or (current["registry"] == url
                                   and version_key(entry.version) > version_key(current["version"])):
                seen[entry.name] = {"name": entry.name, "version": entry.version, "kind": entry.kind,
                                    "bytes": entry.size, "base": entry.base, "description": entry.description,
                                    "registry": url}
    return sorted(seen.values(), key=lambda r: r["name"])


def _index(url: str) -> list[IndexEntry]:
    return open_source(url).index()


def resolve(cfg: Config, reference: str) -> Resolved:
    name, version = split_reference(reference)
    known: set[str] = set()
    errors = []
    for url in cfg.registry.urls:
        try:
            source = open_source(url)
            entries = source.index()
        except RegistryError as exc:
            errors.append(str(exc))
            continue
        known |= {e.name for e in entries}
        matches = [e for e in entries if e.name == name and (version is None or e.version == version)]
        if matches:
            entry = max(matches, key=lambda e: version_key(e.version))
            manifest, folder = source.manifest(entry)
            if manifest.name != name:
                raise RegistryError(f"{source.label}: manifest {entry.manifest} is for {manifest.name!r}, not {name!r}")
            return Resolved(source, entry, manifest, folder)
    if errors and not known:
        raise RegistryError(errors[0])
    close = difflib.get_close_matches(name, sorted(known), n=3)
    hint = f"did you mean {', '.join(close)}?" if close else "see `zenedge search`"
    what = f"{name}:{version}" if version else name
    raise ProfileNotFound(f"no profile {what!r} in the registries ({', '.join(cfg.registry.urls)})",
                          hint=hint)
