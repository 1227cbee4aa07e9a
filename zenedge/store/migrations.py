"""The index schema as an ordered list of small named migrations.

Each runs in its own transaction and is recorded in `_migrations`; a failing one rolls back and
stays pending. Never edit a released migration: append a new one.
"""

from __future__ import annotations

import sqlite3
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # sqlite-utils is imported by whoever writes, not by readers
    import sqlite_utils

Migration = Callable[["sqlite_utils.Database"], None]
MIGRATIONS: list[tuple[str, Migration]] = []


def migration(fn: Migration) -> Migration:
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_initial(db: "sqlite_utils.Database") -> None:
    db["bases"].create({
        "name": str,            # e.g. "smollm2-135m"
        "sha256": str,          # of the weights file: profiles name their base by it
        "dir": str,             # relative to the home: bases/<name>
        "bytes": int,
        "modules": str,         # JSON {module: [out, in]} of the 2-D linear weights
        "aliases": str,         # JSON list of other names (e.g. the Hugging Face repo id)
        "source": str,
        "created_at": float,
    }, pk="name")
    db["blobs"].create({
        "digest": str,
        "bytes": int,
        "role": str,            # "adapter" | "eval": what the blob holds, for per-kind usage
        "created_at": float,
    }, pk="digest")
    db["adapters"].create({
        "id": str,              # = sha256 of its weights blob: the same content is stored once
        "kind": str,            # "lora" | "bitdelta" | "merged"
        "base": str,
        "rank": int,
        "target_modules": str,  # JSON list
        "bytes": int,
        "sha256": str,          # weights blob digest
        "config": str,          # JSON: adapter_config.json for LoRA, format metadata for deltas
        "state": str,           # JSON: merge state (OPCM λ, norms) for merged adapters
        "created_at": float,
        "last_used_at": float,
        "request_count": int,
        "request_rate": float,  # exponentially decayed request count, as of rate_at
        "rate_at": float,
        "pinned": int,
        "origin": str,          # JSON: where it came from (registry url, path, merge)
    }, pk="id", foreign_keys=[("base", "bases", "name"), ("sha256", "blobs", "digest")])
    db["names"].create({
        "name": str,            # what users type
        "adapter_id": str,      # the adapter that serves it (a merged one may serve many)
        "version": str,
        "description": str,
        "eval_blob": str,       # digest of the profile's eval set, kept after merges
        "quality": str,         # JSON: base/own eval scores measured on entry (the gate's anchors)
        "origin": str,
        "created_at": float,
    }, pk="name", foreign_keys=[("adapter_id", "adapters", "id")])
    db["merges"].create({
        "id": int,
        "result_id": str,
        "members": str,         # JSON list of names
        "method": str,
        "similarity": float,
        "retention": str,       # JSON {name: retention}
        "created_at": float,
    }, pk="id")
    db["events"].create({
        "id": int,
        "at": float,
        "kind": str,            # import, pull, rm, evict, merge, budget, reconcile, gc, ...
        "name": str,
        "adapter_id": str,
        "detail": str,          # JSON
    }, pk="id")
    db["names"].create_index(["adapter_id"])
    db["events"].create_index(["at"])


@migration
def m002_base_weights_digest(db: "sqlite_utils.Database") -> None:
    # A base converted from GGUF is identified by its source file; its weights file has a digest
    # too, and manifests made from the converted directory name that one.
    db["bases"].add_column("weights_sha256", str)


def migrate(db: "sqlite_utils.Database") -> list[str]:
    """Apply pending migrations in order; return the names applied."""
    if "_migrations" not in db.table_names():
        db["_migrations"].create({"name": str, "applied_at": float}, pk="name")
    done = {row["name"] for row in db["_migrations"].rows}
    applied = []
    for name, fn in MIGRATIONS:
        if name in done:
            continue
        with db.atomic():  # one transaction per migration: all or nothing
            fn(db)
            db["_migrations"].insert({"name": name, "applied_at": time.time()})
        applied.append(name)
    return applied


def pending_migrations(conn: sqlite3.Connection) -> list[str]:
    """Names of migrations not yet applied (plain sqlite3: cheap enough for every start-up)."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='_migrations'").fetchone()
    done = {r[0] for r in conn.execute("SELECT name FROM _migrations")} if exists else set()
    return [name for name, _ in MIGRATIONS if name not in done]
