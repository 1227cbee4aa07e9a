"""The pool: blobs + SQLite index + writer lock, and the invariants that hold at every commit.

Invariants (checked by `check()`, kept by every method here):
- every blob the index references exists under its digest, complete;
- bytes of referenced blobs ≤ budget B at every commit that adds bytes (the caller passes B);
- every name points to an existing adapter; no adapter is left without a name.
Ordering makes crashes safe: blob files are written (tmp → fsync → rename) before the commit
that references them, and deleted only after the commit that dropped the last reference. A
crash leaves at worst orphan files, which `reconcile()` removes on the next start; staging
directories and partial downloads have owners (owners.py), and only a dead owner's are removed.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from zenedge.errors import AdapterNotFound, BlobDamaged, BudgetExceeded, InvalidInput, PermissionDenied, StorageFull, StoreBusy, StoreCorrupt
from zenedge.names import check_name
from zenedge.sizes import format_size
from zenedge.store.blobs import BlobStore, fsync_dir
from zenedge.store.lock import WriterLock
from zenedge.store.migrations import migrate, pending_migrations
from zenedge.store.owners import Downloads, collect_staging

RATE_HALF_LIFE = 24 * 3600.0  # a request counts half as much after a day
SNAPSHOT_NAME = "index-snapshot.json"   # `_write_snapshot`: the rows `zenedge pool recover` restores
SNAPSHOT_FORMAT = "zenedge-index-snapshot/1"
SNAPSHOT_TABLES = ("bases", "blobs", "adapters", "names", "merges")   # in foreign-key order
DISK_MARGIN = 64 * 2**20      # free space a write must leave on the pool's disk (`ensure_disk_space`)


def private_home(home: Path) -> None:
    """Create the home 0700 (it holds the user's adapters, eval sets and logs), and tighten one that
    is ours and open to others. A home we cannot change is left as it is."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        info = home.stat()
        if info.st_uid == os.getuid() and info.st_mode & 0o077:
            os.chmod(home, 0o700)
    except OSError:
        pass


def decayed_rate(rate: float, rate_at: float, now: float) -> float:
    return rate * 0.5 ** (max(0.0, now - rate_at) / RATE_HALF_LIFE)


@dataclass
class NewName:
    name: str
    version: str = ""
    description: str = ""
    eval_path: Path | None = None      # the profile's eval set, kept after merges
    quality: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, Any] = field(default_factory=dict)


@dataclass
class NewAdapter:
    kind: str                          # "lora" | "bitdelta" | "merged"
    base: str
    weights: Path                      # the one weights file, stored as a blob
    rank: int = 0
    target_modules: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, Any] = field(default_factory=dict)


_STATS = "created_at, last_used_at, request_count, request_rate, rate_at, pinned"   # what `inherits` carries over


@dataclass
class Usage:
    used_bytes: int
    by_kind: dict[str, int]            # adapter kinds, plus "eval" for eval sets
    adapters: int
    bases_bytes: int


SQLITE_HEADER = b"SQLite format 3\x00"
# SQLite's errors for a -shm file it cannot create, grow or map (a full disk, no inodes left)
_NO_SHARED_MEMORY = {"SQLITE_IOERR_SHMOPEN", "SQLITE_IOERR_SHMSIZE", "SQLITE_IOERR_SHMMAP"}


class Store:
    def __init__(self, home: Path, *, reconcile: bool = True, trust: bool = True, index: str = "index.db"):
        """`trust=False`, `index`: skip the index checks, use another file (`zenedge pool recover`
        builds a new index beside the damaged one)."""
        self.home = Path(home)
        private_home(self.home)
        # A home we cannot write (a read-only mount, another user's files) still answers reads:
        # the index is opened immutable, and nothing is migrated, reconciled or written.
        self.read_only = not os.access(self.home, os.W_OK)
        self.blobs = BlobStore(self.home, create=not self.read_only)
        self.bases_dir = self.home / "bases"
        if not self.read_only:
            self.bases_dir.mkdir(exist_ok=True)
        self.downloads = Downloads(self.home)
        self.lock = WriterLock(self.home / "lock")
        self.path = self.home / index
        self._local = threading.local()
        if trust:
            self._trust_index()
        if self.read_only:
            return
        if pending_migrations(self.conn):
            with self.lock.hold():
                migrate(self.db)
        if reconcile:
            # partial downloads stay: an interrupted pull resumes from them; gc and maintain collect them
            self.reconcile(blocking=False, downloads=False)

    def _trust_index(self) -> None:
        """Refuse an index that cannot be the pool's: one that is missing or empty while the home
        holds blobs or bases (it would read as an empty pool, and reconciling would delete them all),
        one whose header is not SQLite's, one SQLite finds damaged. Nothing is changed then;
        `zenedge pool recover` rebuilds it from what the home holds."""
        hint = "`zenedge pool recover` rebuilds it from the stored files (the damaged one is kept aside)"

        def refuse_as_empty(state: str) -> None:
            blobs = sum(1 for _ in self.blobs.digests())
            bases = len(list(self.bases_dir.iterdir())) if self.bases_dir.is_dir() else 0
            if blobs or bases:
                raise StoreCorrupt(f"the pool's index {self.path} is {state}, but the home holds {blobs} blobs and "
                                   f"{bases} bases: refusing to treat the pool as empty", hint=hint)

        if not self.path.exists() or self.path.stat().st_size == 0:
            return refuse_as_empty("empty" if self.path.exists() else "missing")
        with open(self.path, "rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
        if header != SQLITE_HEADER:
            raise StoreCorrupt(f"the pool's index {self.path} is not an SQLite database (damaged header)", hint=hint)
        try:
            verdict = self.conn.execute("PRAGMA quick_check").fetchone()[0]
        except sqlite3.OperationalError:
            raise                 # the machine's fault (I/O, a full disk, a lock): errors.from_environment says so
        except sqlite3.DatabaseError as exc:
            verdict = str(exc)
        if verdict != "ok":
            self.close()
            raise StoreCorrupt(f"the pool's index {self.path} is damaged ({verdict.splitlines()[0]})", hint=hint)
        if not self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = '_migrations'").fetchone():
            self.close()
            refuse_as_empty("without the pool's tables")

    # -- connections ---------------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        """One connection per thread (sqlite3 connections must not be shared across threads).
        Reads use it directly; `db` wraps the same connection in sqlite-utils for writes, so
        read-only commands never pay sqlite-utils' import time."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.read_only:   # no -wal/-shm files can be made: read the file as it is
                conn = sqlite3.connect(f"{self.path.absolute().as_uri()}?immutable=1", uri=True, timeout=10.0)
            else:
                conn = self._connect()
                conn.execute("PRAGMA synchronous=FULL")      # a commit survives power loss
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
        return conn

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10.0)
        try:
            conn.execute("PRAGMA journal_mode=WAL")          # readers never block the writer
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if getattr(exc, "sqlite_errorname", None) not in _NO_SHARED_MEMORY:
                raise
        # A disk too full for the WAL's shared-memory index (the 32 KiB -shm file): with the file
        # locked exclusively, SQLite keeps that index in this process's memory instead, so reads
        # (and any write that fits) still work on a full disk; other processes wait meanwhile.
        conn = sqlite3.connect(self.path, timeout=10.0)
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    @property
    def db(self):
        """sqlite-utils view of this thread's connection (imported on first write)."""
        db = getattr(self._local, "db", None)
        if db is None:
            import sqlite_utils

            db = sqlite_utils.Database(self.conn, execute_plugins=False)
            self._local.db = db
        return db

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            self._local.db = None

    def _rows(self, sql: str, params: list[Any] = ()) -> list[dict[str, Any]]:
        cursor = self.conn.execute(sql, params)
        keys = [c[0] for c in cursor.description]
        return [_decode(dict(zip(keys, row))) for row in cursor.fetchall()]

    @contextmanager
    def writing(self, timeout: float = 60.0) -> Iterator[None]:
        """Hold the writer lock for a whole operation (blob writes + one transaction)."""
        if self.read_only:
            raise PermissionDenied(f"the zenedge home {self.home} is not writable by you: the pool can be read, "
                                   "not changed", hint="fix its permissions, or set ZENEDGE_HOME to a home of yours")
        with self.lock.hold(timeout):
            changes = self.conn.total_changes
            try:
                yield
            finally:
                if self.conn.total_changes != changes and self.lock.depth == 1:
                    self._write_snapshot()

    # -- reads (never take the writer lock) ------------------------------------------------
    def usage(self) -> Usage:
        rows = self.conn.execute(
            """SELECT b.role, a.kind, b.bytes FROM blobs b LEFT JOIN adapters a ON a.sha256 = b.digest
               WHERE b.digest IN (SELECT sha256 FROM adapters UNION SELECT eval_blob FROM names
                                  WHERE eval_blob IS NOT NULL)"""
        ).fetchall()
        by_kind: dict[str, int] = {}
        for role, kind, size in rows:
            key = kind if role == "adapter" and kind else role
            by_kind[key] = by_kind.get(key, 0) + size
        bases = self.conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM bases").fetchone()[0]
        count = self.conn.execute("SELECT COUNT(*) FROM adapters").fetchone()[0]
        return Usage(sum(by_kind.values()), by_kind, count, bases)

    def ensure_disk_space(self, nbytes: int, what: str) -> None:
        """Refuse, before any write, what would leave the disk holding the pool with less than
        DISK_MARGIN free (SQLite's journal, staging copies and the OS need room: a full disk
        mid-commit is survivable, but costs the user a confusing failure)."""
        free = shutil.disk_usage(self.home).free
        if nbytes + DISK_MARGIN > free:
            raise StorageFull(f"{what} needs {format_size(nbytes)} and a {format_size(DISK_MARGIN)} margin, but the disk "
                              f"holding {self.home} has {format_size(free)} free",
                              hint="free some disk space, then run the command again")

    def used_bytes(self) -> int:
        return self.usage().used_bytes

    def names(self) -> list[dict[str, Any]]:
        """Every profile name with the adapter serving it."""
        rows = self.conn.execute(
            """SELECT n.name, n.version, n.description, n.adapter_id, a.kind, a.bytes, a.base, a.rank,
                      a.pinned, a.request_count, a.last_used_at, a.created_at,
                      (SELECT COUNT(*) FROM names m WHERE m.adapter_id = n.adapter_id) AS sharing,
                      json_extract(a.state, '$.compressed.to') AS compressed_to
               FROM names n JOIN adapters a ON a.id = n.adapter_id ORDER BY n.name"""
        ).fetchall()
        keys = ["name", "version", "description", "adapter_id", "kind", "bytes", "base", "rank", "pinned",
                "request_count", "last_used_at", "created_at", "sharing", "compressed_to"]
        return [dict(zip(keys, row)) for row in rows]

    def name(self, name: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM names WHERE name = ?", [name])
        return rows[0] if rows else None

    def adapter(self, adapter_id: str) -> dict[str, Any]:
        rows = self._rows("SELECT * FROM adapters WHERE id = ?", [adapter_id])
        if not rows:
            raise AdapterNotFound(f"no adapter {adapter_id[:12]} in the pool")
        return rows[0]

    def adapters(self) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM adapters ORDER BY created_at")

    def names_of(self, adapter_id: str) -> list[str]:
        return [r[0] for r in self.conn.execute(
            "SELECT name FROM names WHERE adapter_id = ? ORDER BY name", [adapter_id]).fetchall()]

    def resolve(self, name: str) -> dict[str, Any]:
        """Profile name → the adapter row that serves it; a clear error when it is not pulled."""
        check_name(name, "profile name")
        row = self.conn.execute("SELECT adapter_id FROM names WHERE name = ?", [name]).fetchone()
        if row is None:
            raise AdapterNotFound(f"{name!r} is not in the pool", hint=f"run `zenedge pull {name}`")
        return self.adapter(row[0])

    def bases(self) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM bases ORDER BY name")

    def base(self, name: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM bases WHERE name = ?", [name])
        return rows[0] if rows else None

    def base_dir(self, name: str) -> Path:
        return self.bases_dir / check_name(name, "base name")

    def events(self, limit: int = 50) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM events ORDER BY id DESC LIMIT ?", [limit])

    def merges(self) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM merges ORDER BY id")

    def blob_path(self, digest: str) -> Path:
        return self.blobs.path(digest)

    def verified_blob(self, digest: str) -> Path:
        """The path of a stored blob whose bytes still hash to its digest, re-hashed now (cheap at
        adapter sizes); BlobDamaged naming the profiles it serves otherwise.
        Whatever is read from the pool to serve, merge, gate or export comes through here, so a
        damaged file is refused, never served or copied into a merge."""
        if self.blobs.verify(digest):
            return self.blobs.path(digest)
        raise self.damaged(digest, "its bytes no longer match its sha256" if self.blobs.has(digest) else "it is missing")

    def damaged(self, digest: str, why: str) -> BlobDamaged:
        """The error for a damaged blob, naming the profiles that use it and how to mend them."""
        served = self.names_of(digest)
        evals = [r[0] for r in self.conn.execute("SELECT name FROM names WHERE eval_blob = ? ORDER BY name", [digest])]
        what = (f"the stored adapter of {', '.join(map(repr, served))}" if served else
                f"the stored eval set of {', '.join(map(repr, evals))}" if evals else f"blob sha256-{digest[:12]}")
        again = " / ".join(f"`zenedge pull {n}`" for n in (served or evals)[:2]) or "`zenedge pool check --deep`"
        return BlobDamaged(f"{what} is damaged ({why}, sha256 {digest[:12]})",
                           hint=f"{again} stores it again (or import it again); `zenedge pool check --deep` "
                                "lists every damaged file")

    def freed_by_evicting(self, adapter_id: str) -> int:
        """Bytes evicting this adapter gives back: its blob, and the eval sets of its names that no
        other name references (a shared eval set stays, so it is not counted)."""
        freed = self.adapter(adapter_id)["bytes"]
        for (eval_blob,) in self.conn.execute(
                "SELECT eval_blob FROM names WHERE adapter_id = ? AND eval_blob IS NOT NULL", [adapter_id]).fetchall():
            shared = self.conn.execute("SELECT COUNT(*) FROM names WHERE eval_blob = ?", [eval_blob]).fetchone()[0]
            if shared == 1:
                freed += self.conn.execute("SELECT bytes FROM blobs WHERE digest = ?", [eval_blob]).fetchone()[0]
        return freed

    # -- writes ------------------------------------------------------------------------------
    def add_base(self, name: str, source_dir: Path, *, sha256: str, modules: dict[str, list[int]],
                 aliases: list[str] = (), source: str = "", weights_sha256: str | None = None,
                 move: bool = False) -> dict[str, Any]:
        """Register a base: copy its files into bases/<name> (tmp dir + rename), then index it.
        `move`: `source_dir` is a staging directory on the store's file system, renamed instead
        of copied (a GGUF base: a gigabyte not written twice)."""
        check_name(name, "base name")
        with self.writing():
            if self.base(name):
                raise InvalidInput(f"a base named {name!r} is already registered")
            final = self.base_dir(name)
            staging = self.blobs.tmp / f"base-{name}-{time.time_ns()}"
            if move:
                Path(source_dir).rename(staging)
            else:
                shutil.copytree(source_dir, staging)
            size = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
            if final.exists():  # leftover of a crash between rename and commit
                shutil.rmtree(final)
            staging.rename(final)
            fsync_dir(self.bases_dir)
            with self.db.atomic():
                self.db["bases"].insert({
                    "name": name, "sha256": sha256, "dir": f"bases/{name}", "bytes": size,
                    "modules": json.dumps(modules), "aliases": json.dumps(list(aliases)),
                    "source": source, "created_at": time.time(), "weights_sha256": weights_sha256 or sha256,
                })
                self._event("base-add", name, None, {"bytes": size, "source": source})
            return self.base(name)

    def put_adapter(self, adapter: NewAdapter, names: list[NewName], *, budget: int,
                    max_adapters: int | None = None, replaces: list[str] = (),
                    event: str = "import", merge: dict[str, Any] | None = None,
                    inherits: str | None = None) -> str:
        """Store one adapter and point `names` at it, in one transaction, within `budget`.

        `replaces`: adapter ids deleted in the same transaction (a merge evicting its members;
        their names are re-pointed at the new adapter). `inherits`: one of them whose request
        statistics and pin the new adapter takes over (the same profiles re-stored smaller).
        """
        with self.writing():
            return self._put_adapter(adapter, names, budget=budget, max_adapters=max_adapters,
                                     replaces=replaces, event=event, merge=merge, inherits=inherits)

    def _put_adapter(self, adapter: NewAdapter, names: list[NewName], *, budget: int,
                     max_adapters: int | None, replaces: list[str], event: str,
                     merge: dict[str, Any] | None, inherits: str | None = None) -> str:
        for n in names:
            check_name(n.name, "profile name")
        staged: list[str] = []
        what = f"adding {', '.join(repr(n.name) for n in names) or 'an adapter'}"
        try:
            digest, size = self.blobs.put_file(adapter.weights)
            staged.append(digest)
            evals = {}
            for n in names:
                if n.eval_path is not None:
                    evals[n.name] = self.blobs.put_file(n.eval_path)
                    staged.append(evals[n.name][0])
            now = time.time()
            with self.db.atomic():
                existing = self.conn.execute("SELECT id FROM adapters WHERE id = ?", [digest]).fetchone()
                if not existing:
                    self._insert_blob(digest, size, "adapter", now)
                    self.db["adapters"].insert({
                        "id": digest, "kind": adapter.kind, "base": adapter.base, "rank": adapter.rank,
                        "target_modules": json.dumps(adapter.target_modules), "bytes": size,
                        "sha256": digest, "config": json.dumps(adapter.config),
                        "state": json.dumps(adapter.state), "created_at": now, "last_used_at": now,
                        "request_count": 0, "request_rate": 0.0, "rate_at": now,
                        "pinned": 0, "origin": json.dumps(adapter.origin),  # pins: set_pinned only
                    })
                for n in names:
                    eval_digest = None
                    if n.name in evals:
                        eval_digest, eval_size = evals[n.name]
                        self._insert_blob(eval_digest, eval_size, "eval", now)
                    self.db["names"].upsert({
                        "name": n.name, "adapter_id": digest, "version": n.version,
                        "description": n.description, "eval_blob": eval_digest,
                        "quality": json.dumps(n.quality), "origin": json.dumps(n.origin), "created_at": now,
                    }, pk="name")
                if inherits is not None and inherits != digest:
                    self.conn.execute(
                        f"UPDATE adapters SET ({_STATS}) = (SELECT {_STATS} FROM adapters WHERE id = ?) WHERE id = ?",
                        [inherits, digest])
                for old in replaces:
                    if old != digest:
                        self.conn.execute("UPDATE names SET adapter_id = ? WHERE adapter_id = ?", [digest, old])
                        self.conn.execute("DELETE FROM adapters WHERE id = ?", [old])
                if merge is not None:
                    self.db["merges"].insert({**merge, "result_id": digest, "created_at": now})
                self._drop_unnamed()
                self._check_budget(budget, extra=f"{what} ({format_size(size)})")
                if max_adapters is not None:
                    count = self.conn.execute("SELECT COUNT(*) FROM adapters").fetchone()[0]
                    if count > max_adapters:
                        raise BudgetExceeded(
                            f"the pool holds its maximum of {max_adapters} adapters (pool.max_adapters)",
                            hint="remove one with `zenedge rm NAME` or raise pool.max_adapters",
                        )
                for n in names:
                    self._event(event, n.name, digest, {"kind": adapter.kind, "bytes": size, **adapter.origin})
            staged.clear()
            return digest
        finally:
            self._delete_unreferenced(staged)
            self._collect()

    def remove_name(self, name: str, *, event: str = "rm") -> dict[str, Any]:
        """Forget a profile name; its adapter goes too when no other name uses it."""
        check_name(name, "profile name")
        with self.writing():
            row = self.name(name)
            if row is None:
                raise AdapterNotFound(f"{name!r} is not in the pool", hint="see `zenedge list`")
            before = self.used_bytes()
            with self.db.atomic():
                self.conn.execute("DELETE FROM names WHERE name = ?", [name])
                self._drop_unnamed()
                self._event(event, name, row["adapter_id"], {})
            freed = before - self.used_bytes()
            self._collect()
            return {"name": name, "adapter_id": row["adapter_id"], "freed_bytes": freed}

    def evict(self, adapter_ids: list[str], *, reason: str) -> list[str]:
        """Delete adapters and all their names in one transaction; return the names removed."""
        with self.writing():
            removed = []
            with self.db.atomic():
                for adapter_id in adapter_ids:
                    names = self.names_of(adapter_id)
                    removed += names
                    self.conn.execute("DELETE FROM names WHERE adapter_id = ?", [adapter_id])
                    self.conn.execute("DELETE FROM adapters WHERE id = ?", [adapter_id])
                    self._event("evict", ",".join(names), adapter_id, {"reason": reason})
                self._drop_unnamed()
            self._collect()
            return removed

    def set_quality(self, name: str, quality: dict[str, Any]) -> None:
        """Store a profile's quality anchors (measured by a gate whose merge was not kept)."""
        with self.writing(), self.db.atomic():
            self.conn.execute("UPDATE names SET quality = ? WHERE name = ?", [json.dumps(quality), name])

    def set_pinned(self, name: str, pinned: bool) -> dict[str, Any]:
        with self.writing():
            adapter = self.resolve(name)
            with self.db.atomic():
                self.conn.execute("UPDATE adapters SET pinned = ? WHERE id = ?", [int(pinned), adapter["id"]])
                self._event("pin" if pinned else "unpin", name, adapter["id"], {})
            return self.adapter(adapter["id"])

    def record_budget(self, budget: int, *, evicted: list[str]) -> None:
        """Log a budget change (and what it evicted) in the pool's event history."""
        with self.writing(), self.db.atomic():
            self._event("budget", None, None, {"budget": budget, "evicted": evicted})

    def record_requests(self, adapter_id: str, count: int = 1, now: float | None = None) -> None:
        """Bump the request counters the eviction order uses (no writer lock: stats only)."""
        if self.read_only:
            return  # a home we may only read still serves; its counters stay as they were
        now = time.time() if now is None else now
        with self.db.atomic():
            row = self.conn.execute("SELECT request_rate, rate_at FROM adapters WHERE id = ?", [adapter_id]).fetchone()
            if row is None:
                return
            rate = decayed_rate(row[0], row[1], now) + count
            self.conn.execute(
                """UPDATE adapters SET request_count = request_count + ?, request_rate = ?, rate_at = ?,
                   last_used_at = ? WHERE id = ?""", [count, rate, now, now, adapter_id])

    def pinned_ids(self, pinned_names: Iterable[str] = ()) -> set[str]:
        """The one answer to "is it pinned" (eviction, merging, the runtime's delta cache and listings
        all ask here): adapters pinned with `zenedge pin` (their column), and adapters serving a
        name the config pins (`runtime.pinned`, passed in: the store does not read the config)."""
        pinned = {r[0] for r in self.conn.execute("SELECT id FROM adapters WHERE pinned = 1").fetchall()}
        names = list(pinned_names)
        if names:
            marks = ", ".join("?" * len(names))
            pinned |= {r[0] for r in self.conn.execute(
                f"SELECT adapter_id FROM names WHERE name IN ({marks})", names).fetchall()}
        return pinned

    def eviction_order(self, now: float | None = None, pinned_names: Iterable[str] = ()) -> list[dict[str, Any]]:
        """Unpinned adapters (`pinned_ids`), least valuable first: lowest decayed request rate, then
        fewest profiles served (among equally requested adapters, evicting a merge of three profiles
        to admit one is the worst choice), then least recent."""
        now = time.time() if now is None else now
        pinned = self.pinned_ids(pinned_names)
        serving: dict[str, int] = {}
        for row in self.conn.execute("SELECT adapter_id, COUNT(*) FROM names GROUP BY adapter_id"):
            serving[row[0]] = row[1]
        candidates = [a for a in self.adapters() if a["id"] not in pinned]
        return sorted(candidates, key=lambda a: (decayed_rate(a["request_rate"], a["rate_at"], now),
                                                 serving.get(a["id"], 0), a["last_used_at"], a["created_at"]))

    # -- the snapshot `zenedge pool recover` restores from ------------------------------------
    def _write_snapshot(self) -> None:
        """The rows that describe the pool (bases, blobs, adapters, names, merges; not the event
        log), written beside the index after every operation that changed it, atomically. Only
        `recover` reads it: should the index be lost, what it held can be rebuilt with the blobs."""
        path = self.home / SNAPSHOT_NAME
        tmp = path.with_name(f".{SNAPSHOT_NAME}.{os.getpid()}.tmp")
        try:
            rows = {table: [dict(zip([c[0] for c in cursor.description], row)) for row in cursor.fetchall()]
                    for table in SNAPSHOT_TABLES for cursor in [self.conn.execute(f"SELECT * FROM {table}")]}
            text = json.dumps({"format": SNAPSHOT_FORMAT, "written_at": time.time(), "rows": rows})
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except (OSError, sqlite3.Error):
            tmp.unlink(missing_ok=True)   # the commit stands; only the recovery copy is a step behind

    def snapshot(self) -> dict[str, list[dict[str, Any]]] | None:
        """The last snapshot's rows, or None when there is none (or it cannot be read)."""
        try:
            data = json.loads((self.home / SNAPSHOT_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data.get("rows") if isinstance(data, dict) and data.get("format") == SNAPSHOT_FORMAT else None

    def restore(self, rows: dict[str, list[dict[str, Any]]], event: dict[str, Any]) -> None:
        """Insert rows (a snapshot's, or rebuilt ones) into an index being rebuilt, in one
        transaction, with a "recover" event; the caller holds the writer lock."""
        with self.db.atomic():
            for table in SNAPSHOT_TABLES:
                for row in rows.get(table, ()):
                    columns = list(row)
                    self.conn.execute(f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) "
                                      f"VALUES ({', '.join('?' * len(columns))})", [row[c] for c in columns])
            self._drop_unnamed()
            self._event("recover", None, None, event)

    # -- internals -------------------------------------------------------------------------
    def _insert_blob(self, digest: str, size: int, role: str, now: float) -> None:
        self.conn.execute("INSERT OR IGNORE INTO blobs (digest, bytes, role, created_at) VALUES (?, ?, ?, ?)",
                        [digest, size, role, now])

    def _drop_unnamed(self) -> None:
        self.conn.execute("DELETE FROM adapters WHERE id NOT IN (SELECT adapter_id FROM names)")
        self.conn.execute(
            """DELETE FROM blobs WHERE digest NOT IN (SELECT sha256 FROM adapters)
               AND digest NOT IN (SELECT eval_blob FROM names WHERE eval_blob IS NOT NULL)""")

    def _check_budget(self, budget: int, extra: str) -> None:
        used = self.used_bytes()
        if used > budget:
            raise BudgetExceeded(
                f"{extra} would use {format_size(used)} of the {format_size(budget)} budget "
                f"({format_size(used - budget)} over)",
                hint="free space with `zenedge rm NAME` or raise it with `zenedge budget set SIZE`",
            )

    def _event(self, kind: str, name: str | None, adapter_id: str | None, detail: dict[str, Any]) -> None:
        self.db["events"].insert({"at": time.time(), "kind": kind, "name": name, "adapter_id": adapter_id,
                                  "detail": json.dumps(detail)})

    def _referenced(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT digest FROM blobs").fetchall()}

    def _delete_unreferenced(self, digests: list[str]) -> None:
        if not digests:
            return
        referenced = self._referenced()
        for digest in digests:
            if digest not in referenced:
                self.blobs.delete(digest)

    def _collect(self) -> None:
        """Delete blob files the committed index no longer references (after the commit)."""
        referenced = self._referenced()
        for digest in list(self.blobs.digests()):
            if digest not in referenced:
                self.blobs.delete(digest)

    # -- maintenance -----------------------------------------------------------------------
    def _leftovers(self) -> tuple[list[Path], list[str], list[Path], int]:
        """What a crash can leave: tmp files, orphan blobs, unindexed base dirs, dangling rows."""
        strays = self.blobs.strays()
        referenced = self._referenced()
        orphans = [d for d in self.blobs.digests() if d not in referenced]
        known = {b["name"] for b in self.bases()}
        base_dirs = [p for p in self.bases_dir.iterdir() if p.name not in known]
        dangling = self.conn.execute(
            """SELECT (SELECT COUNT(*) FROM adapters WHERE id NOT IN (SELECT adapter_id FROM names))
               + (SELECT COUNT(*) FROM blobs WHERE digest NOT IN (SELECT sha256 FROM adapters)
                  AND digest NOT IN (SELECT eval_blob FROM names WHERE eval_blob IS NOT NULL))""").fetchone()[0]
        return strays, orphans, base_dirs, dangling

    def reconcile(self, blocking: bool = True, *, downloads: bool = True) -> dict[str, int]:
        """Remove what a crash can leave behind. Cheap when there is nothing to do (every start).
        `downloads`: also partial downloads no live pull owns (which a new pull would resume)."""
        strays, orphans, base_dirs, dangling = self._leftovers()
        if not (strays or orphans or base_dirs or dangling) and not blocking:
            return {}
        try:
            context = self.writing(timeout=60.0 if blocking else 0.0)
            context.__enter__()
        except StoreBusy:
            return {}  # a writer is active: its leftovers are not leftovers yet
        try:
            strays, orphans, base_dirs, dangling = self._leftovers()  # again, under the lock
            collect_staging(strays)
            for path in base_dirs:
                shutil.rmtree(path, ignore_errors=True)
            counts = {"tmp": len(strays), "orphan_blobs": len(orphans), "orphan_bases": len(base_dirs),
                      "dangling_rows": dangling}
            if downloads:
                counts["partial_downloads"], counts["partial_bytes"] = self.downloads.collect()
            if dangling or any(counts.values()):
                with self.db.atomic():
                    self._drop_unnamed()
                    self._event("reconcile", None, None, counts)
            self._collect()
            return counts
        finally:
            context.__exit__(None, None, None)

    def partial_downloads(self) -> dict[str, int]:
        """Partial files of pulls: those a live pull is writing, and leftovers of interrupted ones
        (count and bytes; a new pull resumes from them, `reconcile()` collects them)."""
        found = self.downloads.list()
        leftovers = [p for p in found if not p.active]
        return {"count": len(leftovers), "bytes": sum(p.bytes for p in leftovers),
                "active": len(found) - len(leftovers)}

    def check(self, budget: int | None = None) -> list[str]:
        """Every invariant violation, as one line each (empty list: the pool is consistent). Every
        blob is re-hashed; the bases' weights are checked by `bases.verify_weights`."""
        problems = []
        referenced = {}
        for digest, size in self.conn.execute("SELECT digest, bytes FROM blobs").fetchall():
            referenced[digest] = size
            path = self.blobs.path(digest)
            if not path.is_file():
                problems.append(f"missing blob sha256-{digest[:12]}")
            elif path.stat().st_size != size:
                problems.append(self.damaged(digest, f"it has {path.stat().st_size} bytes, the index says {size}").message)
            elif not self.blobs.verify(digest):   # adapters and eval sets: milliseconds each
                problems.append(self.damaged(digest, "its bytes no longer match its sha256").message)
        for digest in self.blobs.digests():
            if digest not in referenced:
                problems.append(f"orphan blob sha256-{digest[:12]} (not in the index)")
        for path in self.blobs.strays():
            problems.append(f"leftover temporary file {path.name}")
        for (name,) in self.conn.execute(
                "SELECT name FROM names WHERE adapter_id NOT IN (SELECT id FROM adapters)").fetchall():
            problems.append(f"name {name!r} points to a missing adapter")
        for (adapter_id,) in self.conn.execute(
                "SELECT id FROM adapters WHERE id NOT IN (SELECT adapter_id FROM names)").fetchall():
            problems.append(f"adapter {adapter_id[:12]} has no name")
        for (adapter_id,) in self.conn.execute(
                "SELECT id FROM adapters WHERE sha256 NOT IN (SELECT digest FROM blobs)").fetchall():
            problems.append(f"adapter {adapter_id[:12]} references an unindexed blob")
        unreferenced = self.conn.execute(
            """SELECT digest FROM blobs WHERE digest NOT IN (SELECT sha256 FROM adapters)
               AND digest NOT IN (SELECT eval_blob FROM names WHERE eval_blob IS NOT NULL)""").fetchall()
        for (digest,) in unreferenced:
            problems.append(f"indexed blob sha256-{digest[:12]} is referenced by nothing")
        for base in self.bases():
            if not (self.home / base["dir"]).is_dir():
                problems.append(f"base {base['name']!r} directory is missing")
        if budget is not None:
            used = self.used_bytes()
            if used > budget:
                problems.append(f"budget breached: {used} bytes used > {budget} budget")
        return problems


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    """JSON columns back to Python values."""
    out = dict(row)
    for key in ("target_modules", "config", "state", "origin", "quality", "members", "retention",
                "detail", "modules", "aliases"):
        if isinstance(out.get(key), str):
            try:
                out[key] = json.loads(out[key])
            except json.JSONDecodeError:
                pass
    return out
