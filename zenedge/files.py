"""Files a user names (an adapter, an eval set): regular files only, sizes checked before reading.

A FIFO, a device or a socket would block a reader or never end, and a huge file would be read
into memory before its content could be refused: both are turned away here, from a stat alone.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from zenedge.errors import InvalidInput
from zenedge.sizes import format_size

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def regular_file(path: Path, what: str, max_bytes: int | None = None, hint: str | None = None) -> int:
    """The size of `path` if it is a regular file (symlinks followed) of at most `max_bytes`; else
    one InvalidInput line naming `what` and the reason."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InvalidInput(f"{what} {path}: no such file", hint=hint) from None
    except OSError as exc:
        raise InvalidInput(f"{what} {path}: {exc.strerror or exc}", hint=hint) from None
    for test, kind in _KINDS:
        if test(info.st_mode):
            raise InvalidInput(f"{what} {path} is {kind}, not a regular file", hint=hint)
    if max_bytes is not None and info.st_size > max_bytes:
        raise InvalidInput(f"{what} {path} has {format_size(info.st_size)}; at most {format_size(max_bytes)} is read",
                           hint=hint)
    return info.st_size
