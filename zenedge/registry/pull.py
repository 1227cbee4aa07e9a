"""`zenedge pull NAME[:VERSION]`: resolve through the configured registries in order, check the
base, the disk and the budget before downloading, fetch and verify every file (resuming partial
downloads), then admit it into the pool (zenedge.pool.admission) in one transaction."""

from __future__ import annotations

import difflib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from zenedge import bases
from zenedge.config import Config
from zenedge.errors import ProfileNotFound, RegistryError
from zenedge.names import split_reference
from zenedge.pool import admission
from zenedge.registry.manifest import IndexEntry, Manifest, version_key
from zenedge.registry.sources import open_source
from zenedge.store import Store

Progress = Callable[[dict[str, Any]], None]


@dataclass
class Resolved:
    source: Any
    entry: IndexEntry
    manifest: Manifest
    folder: str


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


def _check_base(store: Store, manifest: Manifest, progress: Progress | None) -> dict[str, Any]:
    base = store.base(manifest.base_name) or bases.find_base(store, manifest.base_name)
    if base is None and manifest.base_name == bases.DEFAULT_BASE:
        if progress:
            progress({"status": f"setting up the base {bases.DEFAULT_BASE}"})
        base = bases.ensure_base(store, bases.DEFAULT_BASE,
                                 progress=(lambda m: progress({"status": m})) if progress else None)
    if base is None:
        raise RegistryError(f"{manifest.name!r} is made for base {manifest.base_name!r}, which is not registered",
                            hint="add it with `zenedge base add PATH --name NAME`")
    if manifest.base_sha256 and manifest.base_sha256 not in bases.identities(base):
        raise RegistryError(
            f"{manifest.name!r} was made for a different {manifest.base_name!r} "
            f"(sha256 {manifest.base_sha256[:12]}…, yours is {base['sha256'][:12]}…); refusing it")
    return base


def _check_space(store: Store, cfg: Config, manifest: Manifest) -> None:
    store.ensure_disk_space(manifest.size, f"pulling {manifest.name!r}")
    admission.check_admission(store, cfg, manifest.name, manifest.size, manifest.kind)


def pull(store: Store, cfg: Config, reference: str, *, progress: Progress | None = None,
         engine=None) -> dict[str, Any]:
    """`engine`: a running Engine (the daemon's) for the quality gate to reuse, instead of loading
    the base again when the pull has to merge."""
    report = progress or (lambda event: None)
    report({"status": "resolving", "name": reference})
    resolved = resolve(cfg, reference)
    manifest = resolved.manifest
    base = _check_base(store, manifest, progress)
    digests = [entry.sha256 for entry in manifest.files] + ([manifest.eval.sha256] if manifest.eval else [])

    def waiting(digest: str) -> None:
        report({"status": "waiting", "detail": "another pull is fetching the same files"})

    # Own these files' downloads until the commit: a second pull of them waits here, then finds
    # them stored (up to date, or dedup) instead of writing into the same partial file.
    with store.downloads.claim(digests, on_wait=waiting):
        return _fetch_and_commit(store, cfg, resolved, base, report, progress, engine)


def _fetch_and_commit(store: Store, cfg: Config, resolved: Resolved, base: dict[str, Any], report: Progress,
                      progress: Progress | None, engine) -> dict[str, Any]:
    manifest = resolved.manifest
    weights = manifest.file("weights")
    existing = store.name(manifest.name)
    if existing and _holds(store, existing, weights.sha256):
        report({"status": "up to date", "name": manifest.name})
        return _result(store, manifest, weights.sha256, up_to_date=True)
    _check_space(store, cfg, manifest)
    with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as staging_name:
        staging = Path(staging_name)
        files = list(manifest.files) + ([manifest.eval] if manifest.eval else [])
        for entry in files:
            target = staging / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            present = _stored_from(store, entry.sha256)
            if present is not None:  # dedup by digest: already here (and intact), no transfer
                shutil.copyfile(present, target)
                report({"status": "present", "file": entry.path, "completed": entry.size, "total": entry.size})
                continue
            done = [0]

            def on_bytes(n: int, entry=entry, done=done) -> None:
                done[0] += n
                report({"status": "downloading", "file": entry.path, "completed": done[0], "total": entry.size})

            part = store.downloads.part(entry.sha256)
            resolved.source.fetch(resolved.folder, entry.path, part, sha256=entry.sha256, size=entry.size,
                                  progress=on_bytes)
            part.replace(target)
        report({"status": "verifying"})
        origin = {"source": "pull", "registry": resolved.source.label, "version": manifest.version,
                  "sha256": weights.sha256}
        eval_path = staging / manifest.eval.path if manifest.eval else None
        report({"status": "committing"})
        if manifest.kind == "lora":
            lora_dir = staging / ".peft"  # PEFT's file names, whatever the registry calls them
            lora_dir.mkdir()
            (staging / weights.path).replace(lora_dir / "adapter_model.safetensors")
            (staging / manifest.file("config").path).replace(lora_dir / "adapter_config.json")
            result = admission.import_lora(
                store, cfg, lora_dir, manifest.name, base=base["name"], eval_path=eval_path,
                version=manifest.version, description=manifest.description, origin=origin, engine=engine,
                progress=progress, anchors=manifest.eval_anchors)
        else:
            result = admission.import_bitdelta(
                store, cfg, staging / weights.path, manifest.name, base=base["name"], eval_path=eval_path,
                version=manifest.version, description=manifest.description, origin=origin, engine=engine,
                progress=progress, anchors=manifest.eval_anchors)
    report({"status": "success", "name": manifest.name})
    return _result(store, manifest, result["adapter_id"], policy_result=result)


def _stored_from(store: Store, digest: str) -> Path | None:
    """An intact blob holding the file `digest` names: that file itself, or the adapter the pool
    stored from it in another format (its names' origin records the digest it was pulled as)."""
    if store.blobs.verify(digest):
        return store.blobs.path(digest)
    for listed in store.names():
        name = store.name(listed["name"])
        if name and (name.get("origin") or {}).get("sha256") == digest and _holds(store, name, digest):
            return store.blob_path(store.adapter(name["adapter_id"])["sha256"])
    return None


def _holds(store: Store, name: dict[str, Any], digest: str) -> bool:
    """Whether the profile `name` is already served by the weights `digest` names: stored as they
    came, or from them in another format (the pool stores float32 as bf16, and re-stores adapters
    smaller under pressure; a merged adapter no longer serves them alone), intact on disk."""
    adapter = store.adapter(name["adapter_id"])
    same = adapter["id"] == digest or (adapter["kind"] != "merged" and (name.get("origin") or {}).get("sha256") == digest)
    return same and store.blobs.verify(adapter["sha256"])


def _result(store: Store, manifest: Manifest, adapter_id: str, up_to_date: bool = False,
            policy_result: dict[str, Any] | None = None) -> dict[str, Any]:
    row = store.resolve(manifest.name)
    result = {"name": manifest.name, "version": manifest.version, "kind": row["kind"], "bytes": row["bytes"],
              "adapter_id": row["id"], "up_to_date": up_to_date}
    if policy_result:  # what the pool did to admit it (merged with / evicted), and where the time went
        result["policy"] = policy_result.get("action")
        result.update({key: policy_result[key] for key in POLICY_DETAILS if policy_result.get(key)})
    return result


POLICY_DETAILS = ("merged_with", "evicted", "attempts", "compressed", "profile")
