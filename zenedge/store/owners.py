"""Temporary files with an owner: an advisory flock held by the live process working on them.

A killed process's flocks vanish with it, so "can I take its lock without waiting?" is an exact
liveness test (a pid file is not: pids are reused). Clean-up takes the same lock without waiting
and removes only what it could lock, so it never pulls files from under a running command.

- Staging directories `tmp/<pid>-<random>/`: each `BlobStore` stages in one of its own, locked
  through the directory itself from its creation until the store is gone (or the process exits).
  `zenedge list` starting next to a slow pull therefore leaves the pull's files alone.
- Partial downloads `partial/<sha256>.part`, owned through `partial/<sha256>.lock`. A pull holds
  the locks of all its files from before the download until after its commit, so a second pull of
  the same files waits, then finds them stored, instead of writing into the same file.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
import weakref
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from zenedge.names import check_digest

_DIGEST = re.compile(r"[0-9a-f]{64}")


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def lock(path: Path, *, create: bool, wait: bool) -> int | None:
    """An fd holding an exclusive flock on `path` (a file or a directory), or None: someone else
    holds it (`wait=False`), or `path` is gone. Checked after locking that `path` still names what
    we locked, because the previous holder may have removed it meanwhile; with `create`, a lock
    file removed that way is created afresh and locked again."""
    flags = (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY
    while True:
        try:
            fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            return fd
        os.close(fd)
        if not create:
            return None


def is_free(path: Path) -> bool:
    """True when `path` exists and nobody holds its lock (its owner finished or died)."""
    fd = lock(path, create=False, wait=False)
    if fd is None:
        return False
    os.close(fd)
    return True


def _is_real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _remove_unowned(entry: Path) -> bool:
    """Remove a directory only while holding its lock (so not from under a live owner); anything
    else (a loose file, a symlink) has no owner."""
    if not _is_real_dir(entry):
        entry.unlink(missing_ok=True)
        return True
    fd = lock(entry, create=False, wait=False)
    if fd is None:
        return False
    try:
        shutil.rmtree(entry, ignore_errors=True)
    finally:
        os.close(fd)
    return True


class StagingDir:
    """One directory under tmp/, locked until released: explicitly, when the object is
    garbage-collected, or at exit. Released means removed."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        while True:
            path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))
            fd = lock(path, create=False, wait=True)
            if fd is not None:  # else a clean-up took the brand-new, still unlocked directory
                break
        self.path = path
        self._release = weakref.finalize(self, StagingDir._remove, path, fd, os.getpid())

    def release(self) -> None:
        self._release()

    @staticmethod
    def _remove(path: Path, fd: int, pid: int) -> None:
        if os.getpid() == pid:  # a forked child's copy must not remove its parent's files
            shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def staging_leftovers(root: Path) -> list[Path]:
    """Entries of tmp/ no live process holds: directories whose lock is free, and loose files
    (nothing stages outside a directory; those come from older versions)."""
    if not root.is_dir():
        return []
    return [entry for entry in root.iterdir() if not _is_real_dir(entry) or is_free(entry)]


def collect_staging(entries: list[Path]) -> int:
    """Remove the given leftovers, each only if still unowned at the moment of removal."""
    return sum(_remove_unowned(entry) for entry in entries)


@dataclass(frozen=True)
class PartialDownload:
    digest: str
    bytes: int
    active: bool  # a live pull owns it


class Downloads:
    """`partial/`: resumable downloads by digest, each owned through its lock file."""

    def __init__(self, root: Path):
        self.dir = root / "partial"

    def part(self, digest: str) -> Path:
        return self.dir / f"{check_digest(digest)}.part"

    def _lock_path(self, digest: str) -> Path:
        return self.dir / f"{check_digest(digest)}.lock"

    @contextmanager
    def claim(self, digests: list[str], on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
        """Own the downloads of `digests` until the block ends, waiting for another pull that owns
        one of them. Taken in sorted order, so two pulls with overlapping files cannot deadlock.
        The `.part` files stay for a later pull to resume; the lock files go."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with ExitStack() as held:
            for digest in sorted(set(digests)):
                path = self._lock_path(digest)
                fd = lock(path, create=True, wait=False)
                if fd is None:
                    if on_wait:
                        on_wait(digest)
                    fd = lock(path, create=True, wait=True)
                held.callback(_release_lock_file, path, fd)
            yield

    def list(self) -> list[PartialDownload]:
        if not self.dir.is_dir():
            return []
        found = []
        for part in sorted(self.dir.glob("*.part")):
            digest = part.name[: -len(".part")]
            try:
                size = part.stat().st_size
            except FileNotFoundError:
                continue  # its pull just took it
            lock_path = self.dir / f"{digest}.lock"
            found.append(PartialDownload(digest, size, lock_path.exists() and not is_free(lock_path)))
        return found

    def collect(self) -> tuple[int, int]:
        """Remove partial and lock files no live pull owns; returns (partial files, bytes) removed."""
        if not self.dir.is_dir():
            return 0, 0
        count = size = 0
        for entry in sorted(self.dir.iterdir()):
            stem, _, suffix = entry.name.rpartition(".")
            if suffix not in ("part", "lock") or not _DIGEST.fullmatch(stem):
                _remove_unowned(entry)  # nothing else belongs here
                continue
            lock_path = self.dir / f"{stem}.lock"
            fd = lock(lock_path, create=True, wait=False)
            if fd is None:
                continue  # a live pull owns it
            try:
                if suffix == "part" and entry.exists():
                    count, size = count + 1, size + entry.stat().st_size
                    entry.unlink()
            finally:
                _release_lock_file(lock_path, fd)
        return count, size


def _release_lock_file(path: Path, fd: int) -> None:
    path.unlink(missing_ok=True)  # while still holding it: a waiter notices and takes a fresh one
    os.close(fd)
