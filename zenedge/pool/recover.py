"""`zenedge pool recover`: rebuild a damaged, emptied or missing index from what the home holds.

Nothing is deleted. A fresh index is built beside the old one (`index.db.rebuilding`), under
the writer lock, and renamed into place; the old one (and its -wal/-shm files) is kept aside as
`index.db.damaged-<time>`. Until the rename, other processes meet the damaged index and refuse
it; they never meet an empty index beside the blobs (start-up would delete them as orphans).

1. bases: the rows of the last snapshot (store.SNAPSHOT_NAME, written after every change) whose
   directories are there; other directories under bases/ are registered from their files (the
   default base under its pinned identity);
2. adapters and names: the snapshot's rows whose blobs are there and still match their digests;
3. every other blob (one no row describes, or a damaged one) is moved to `lost+found/` in the
   home before the rename;
4. then profiles of the embedded registry whose files are in `lost+found/` (matched by sha256)
   are imported again from them, and their files leave it; what stays there is listed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from zenedge import bases
from zenedge.config import Config
from zenedge.errors import ZenedgeError
from zenedge.store import Store
from zenedge.digests import file_sha256
from zenedge.store.blobs import PREFIX
from zenedge.store.store import SNAPSHOT_TABLES


REBUILDING = "index.db.rebuilding"
LOST_AND_FOUND = "lost+found"


def recover(home: Path, cfg: Config, say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    (home / REBUILDING).unlink(missing_ok=True)                     # an earlier recover's, interrupted
    fresh = Store(home, reconcile=False, trust=False, index=REBUILDING)   # an empty index beside the old one
    with fresh.lock.hold(timeout=60.0):
        # Built whole and renamed into place under the writer lock: until then another process
        # meets the damaged index and refuses it; never an empty index beside the blobs.
        snapshot = fresh.snapshot() or {}
        intact = {d for d in fresh.blobs.digests() if fresh.blobs.verify(d)}
        damaged = sorted(set(fresh.blobs.digests()) - intact)
        rows = _snapshot_rows(fresh, snapshot, intact)
        rows["bases"] += _unlisted_bases(fresh, {row["name"] for row in rows["bases"]})
        fresh.restore(rows, {"from_snapshot": bool(snapshot)})
        explained = {row["digest"] for row in rows["blobs"]}
        lost = _lost_and_found(fresh, sorted(intact - explained) + damaged)   # not left for reconcile to delete
        fresh.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        fresh.close()
        kept = _set_aside(home)
        (home / REBUILDING).replace(home / "index.db")
    if kept:
        say(f"kept the old index as {kept.name}")
    say(f"restored {len(rows['bases'])} bases and {len(rows['names'])} profiles from "
        + ("the last snapshot" if snapshot else "the bases' directories (no snapshot found)"))
    for digest in damaged:
        say(f"sha256-{digest[:12]} did not match its digest: moved to lost+found/")
    store = Store(home, reconcile=False)
    reimported = _from_registry(store, cfg, home / LOST_AND_FOUND, say)
    lost = [path for path in lost if Path(home / path).exists()]
    return {"kept_index": kept.name if kept else None, "from_snapshot": bool(snapshot),
            "bases": [row["name"] for row in store.bases()], "profiles": [row["name"] for row in store.names()],
            "reimported": reimported, "lost_and_found": lost, "damaged": damaged,
            "problems": store.check(budget=cfg.budget)}


def _set_aside(home: Path) -> Path | None:
    index = home / "index.db"
    if not index.exists():
        return None
    kept = home / f"index.db.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
    for suffix in ("", "-wal", "-shm"):
        part = index.with_name(index.name + suffix)
        if part.exists():
            part.replace(kept.with_name(kept.name + suffix))
    return kept


def _snapshot_rows(store: Store, snapshot: dict[str, list[dict]], intact: set[str]) -> dict[str, list[dict]]:
    """The snapshot's rows that still describe something in the home."""
    rows = {table: list(snapshot.get(table, ())) for table in SNAPSHOT_TABLES}
    rows["bases"] = [b for b in rows["bases"] if (store.home / b["dir"]).is_dir()]
    known = {b["name"] for b in rows["bases"]}
    rows["blobs"] = [b for b in rows["blobs"] if b["digest"] in intact]
    present = {b["digest"] for b in rows["blobs"]}
    rows["adapters"] = [a for a in rows["adapters"] if a["sha256"] in present and a["base"] in known]
    adapters = {a["id"] for a in rows["adapters"]}
    rows["names"] = [{**n, "eval_blob": n["eval_blob"] if n.get("eval_blob") in present else None}
                     for n in rows["names"] if n["adapter_id"] in adapters]
    rows["merges"] = [m for m in rows["merges"] if m["result_id"] in adapters]
    used = {a["sha256"] for a in rows["adapters"]} | {n["eval_blob"] for n in rows["names"] if n["eval_blob"]}
    rows["blobs"] = [b for b in rows["blobs"] if b["digest"] in used]
    return rows


def _unlisted_bases(store: Store, listed: set[str]) -> list[dict[str, Any]]:
    """Rows for base directories the snapshot does not list (the default base: its pinned identity)."""
    found = []
    for directory in sorted(p for p in store.bases_dir.iterdir() if p.is_dir() and p.name not in listed):
        try:
            weights = bases.weights_sha256(directory)
            modules = bases.linear_modules(directory)
        except ZenedgeError:
            continue   # not a model directory: left for reconcile to report
        default = directory.name == bases.DEFAULT_BASE
        found.append({
            "name": directory.name, "sha256": bases.DEFAULT_BASE_SHA256 if default else weights,
            "dir": f"bases/{directory.name}", "bytes": sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()),
            "modules": json.dumps(modules), "aliases": json.dumps(bases.DEFAULT_BASE_ALIASES if default else []),
            "source": "recovered", "created_at": time.time(), "weights_sha256": weights})
    return found


def _from_registry(store: Store, cfg: Config, found: Path, say) -> list[str]:
    """Profiles of the embedded registry whose weights are in lost+found/ (matched by sha256),
    imported again from those files; a file taken in is removed from lost+found/."""
    from zenedge.pool import admission
    from zenedge.registry.sources import DirectorySource, embedded_root

    files = {p.name[len(PREFIX):]: p for p in found.glob(f"{PREFIX}*")} if found.is_dir() else {}
    if not files:
        return []
    source = DirectorySource(embedded_root(), "embedded")
    done = []
    for entry in source.index():
        manifest, folder = source.manifest(entry)
        weights = manifest.file("weights")
        if weights.sha256 not in files or store.name(manifest.name) or not _intact(files[weights.sha256]):
            continue
        evals = files.get(manifest.eval.sha256) if manifest.eval else None
        eval_path = evals if evals is not None and _intact(evals) else None
        origin = {"source": "recover", "registry": "embedded", "version": manifest.version}
        options = dict(base=manifest.base_name, eval_path=eval_path, version=manifest.version,
                       description=manifest.description, origin=origin, anchors=manifest.eval_anchors)
        if manifest.kind == "lora":
            with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as staging:
                lora = Path(staging)
                shutil.copyfile(files[weights.sha256], lora / "adapter_model.safetensors")
                shutil.copyfile(source.root / folder / manifest.file("config").path, lora / "adapter_config.json")
                admission.import_lora(store, cfg, lora, manifest.name, **options)
        else:
            admission.import_bitdelta(store, cfg, files[weights.sha256], manifest.name, **options)
        for taken in (files[weights.sha256], eval_path):
            if taken is not None:
                taken.unlink()
        say(f"imported {manifest.name} again from its stored files (the embedded registry describes them)")
        done.append(manifest.name)
    return done


def _intact(path: Path) -> bool:
    return file_sha256(path) == path.name[len(PREFIX):]


def _lost_and_found(store: Store, digests: list[str]) -> list[str]:
    """Move blobs nothing describes out of blobs/ (where reconcile would delete them as orphans)."""
    if not digests:
        return []
    target = store.home / LOST_AND_FOUND
    target.mkdir(mode=0o700, exist_ok=True)
    moved = []
    for digest in digests:
        source = store.blob_path(digest)
        if source.exists():
            source.replace(target / source.name)
            moved.append(f"{LOST_AND_FOUND}/{source.name}")
    return moved
