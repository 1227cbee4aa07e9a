"""`zenedge pull NAME[:VERSION]`: the registry resolves the reference; the base, the disk and the
budget are checked before anything is downloaded; the registry fetches and verifies the files into
staging; admission stores them (merging or evicting under pressure) in one transaction.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from zenedge.bases import ensure_base, identities
from zenedge.config import Config
from zenedge.errors import BaseNotFound, RegistryError
from zenedge.pool.admission import check_admission, import_path
from zenedge.pool.phases import Progress
from zenedge.pool.results import Admitted, Pulled
from zenedge.registry.manifest import Manifest
from zenedge.registry.resolve import Resolved, resolve
from zenedge.store import Store


def pull(store: Store, cfg: Config, reference: str, *, progress: Progress | None = None,
         engine=None) -> Pulled:
    """`engine`: a running Engine (the daemon's) for the quality gate to reuse, instead of loading
    the base again when the pull has to merge."""
    report = progress or (lambda event: None)
    report({"status": "resolving", "name": reference})
    resolved = resolve(cfg, reference)
    base = _base_for(store, resolved.manifest, report)

    def waiting(digest: str) -> None:
        report({"status": "waiting", "detail": "another pull is fetching the same files"})

    # Own these files' downloads until the commit: a second pull of them waits here, then finds
    # them stored (up to date, or dedup) instead of writing into the same partial file.
    with store.downloads.claim(resolved.digests, on_wait=waiting):
        return _fetch_and_admit(store, cfg, resolved, base, report, progress, engine)


def _base_for(store: Store, manifest: Manifest, report: Progress) -> dict[str, Any]:
    """The base the profile is made for (the default base is set up on first use), refusing one
    whose weights differ from those the profile names."""
    try:
        base = ensure_base(store, manifest.base_name, progress=lambda message: report({"status": message}))
    except BaseNotFound:
        raise RegistryError(f"{manifest.name!r} is made for base {manifest.base_name!r}, which is not registered",
                            hint="add it with `zenedge base add PATH --name NAME`") from None
    if manifest.base_sha256 and manifest.base_sha256 not in identities(base):
        raise RegistryError(
            f"{manifest.name!r} was made for a different {manifest.base_name!r} "
            f"(sha256 {manifest.base_sha256[:12]}…, yours is {base['sha256'][:12]}…); refusing it")
    return base


def _fetch_and_admit(store: Store, cfg: Config, resolved: Resolved, base: dict[str, Any], report: Progress,
                     progress: Progress | None, engine) -> Pulled:
    manifest = resolved.manifest
    weights = manifest.file("weights")
    existing = store.name(manifest.name)
    if existing and _holds(store, existing, weights.sha256):
        report({"status": "up to date", "name": manifest.name})
        return _pulled(store, manifest)
    store.ensure_disk_space(manifest.size, f"pulling {manifest.name!r}")
    check_admission(store, cfg, manifest.name, manifest.size, manifest.kind)
    with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as staging:
        fetched = resolved.fetch_into(Path(staging), store.downloads, lambda digest: _stored_from(store, digest),
                                      report)
        report({"status": "verifying"})
        origin = {"source": "pull", "registry": resolved.source.label, "version": manifest.version,
                  "sha256": weights.sha256}
        report({"status": "committing"})
        admitted = import_path(store, cfg, fetched.adapter, manifest.name, base=base["name"],
                               eval_path=fetched.eval_path, version=manifest.version,
                               description=manifest.description, origin=origin, engine=engine,
                               progress=progress, anchors=manifest.eval_anchors)
    report({"status": "success", "name": manifest.name})
    return _pulled(store, manifest, admitted)


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


def _pulled(store: Store, manifest: Manifest, admitted: Admitted | None = None) -> Pulled:
    row = store.resolve(manifest.name)
    return Pulled(manifest.name, manifest.version, row["kind"], row["bytes"], row["id"], admitted)
