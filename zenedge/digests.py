"""Content digests: the sha256 that names a file, and the one identity of a checkpoint.

A checkpoint's identity is what a .bitdelta file records as its base, what the store records
for a base and checks before loading it, and what a registry manifest names: one definition, so
they always agree, sharded or not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, hex."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def checkpoint_sha256(files: Sequence[Path]) -> str:
    """A checkpoint's identity from its weight files: the one file's sha256; for a sharded
    checkpoint, the sha256 of the listing "name sha256" of its shards in name order (each shard is
    read once, and renaming a shard makes a different checkpoint)."""
    files = sorted(files, key=lambda p: p.name)
    if len(files) == 1:
        return file_sha256(files[0])
    listing = "".join(f"{p.name} {file_sha256(p)}\n" for p in files)
    return hashlib.sha256(listing.encode()).hexdigest()
