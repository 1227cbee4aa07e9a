"""Content-addressed blob files: `blobs/sha256-<hex>`, written to a temp file, fsynced, renamed.

A blob file either exists complete under its final name or not at all; partial writes only ever
live in this store's own staging directory under `tmp/` (see owners.py), which start-up sweeps
once its owner is gone. Digests are validated before any path is built from them.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from zenedge.digests import file_sha256
from zenedge.errors import DigestMismatch
from zenedge.names import check_digest
from zenedge.store.owners import StagingDir, staging_leftovers

CHUNK = 1 << 20
PREFIX = "sha256-"


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (POSIX: the directory entry lives in the directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobStore:
    def __init__(self, root: Path, create: bool = True):
        self.dir = root / "blobs"
        self.tmp_root = root / "tmp"
        if create:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.tmp_root.mkdir(parents=True, exist_ok=True)
        self._staging: StagingDir | None = None
        self._staging_guard = threading.Lock()

    @property
    def tmp(self) -> Path:
        """This store's staging directory (`tmp/<pid>-<random>/`, made on first use, locked while
        the store lives): everything staged goes here, never into tmp/ itself."""
        with self._staging_guard:
            if self._staging is None or not self._staging.path.is_dir():
                self._staging = StagingDir(self.tmp_root)
            return self._staging.path

    def path(self, digest: str) -> Path:
        return self.dir / f"{PREFIX}{check_digest(digest)}"

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        return self.path(digest).stat().st_size

    def digests(self) -> Iterator[str]:
        if not self.dir.is_dir():
            return
        for entry in self.dir.iterdir():
            if entry.name.startswith(PREFIX):
                yield entry.name[len(PREFIX):]

    def strays(self) -> list[Path]:
        """Files in blobs/ that are not well-formed blob names, plus what dead processes left in tmp/."""
        odd = [p for p in self.dir.iterdir() if not p.name.startswith(PREFIX)]
        return odd + staging_leftovers(self.tmp_root)

    def put_stream(self, source: BinaryIO, expected: str | None = None,
                   progress: Callable[[int], None] | None = None) -> tuple[str, int]:
        """Copy a stream into the store, hashing as it goes; return (digest, size)."""
        fd, tmp_name = tempfile.mkstemp(prefix="blob-", dir=self.tmp)
        tmp = Path(tmp_name)
        try:
            hasher, size = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as out:
                while chunk := source.read(CHUNK):
                    hasher.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                    if progress:
                        progress(len(chunk))
                out.flush()
                os.fsync(out.fileno())
            digest = hasher.hexdigest()
            if expected is not None and digest != check_digest(expected):
                raise DigestMismatch(f"content has sha256 {digest}, expected {check_digest(expected)}")
            final = self.path(digest)
            if final.exists() and self.verify(digest):  # same content already stored: keep the first copy
                tmp.unlink()
            else:                                       # (a damaged copy is replaced: a re-pull heals it)
                os.chmod(tmp, 0o600)   # the home is private; so is what it holds
                os.replace(tmp, final)
                fsync_dir(self.dir)
            return digest, size
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def put_file(self, path: Path, expected: str | None = None) -> tuple[str, int]:
        with open(path, "rb") as source:
            return self.put_stream(source, expected)

    def delete(self, digest: str) -> None:
        self.path(digest).unlink(missing_ok=True)

    def verify(self, digest: str) -> bool:
        """Whether the blob is there, a regular file, and its bytes still hash to its name."""
        path = self.path(digest)
        return path.is_file() and file_sha256(path) == digest
