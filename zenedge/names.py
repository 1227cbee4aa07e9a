"""Validation of user-supplied names and digests, before any of them becomes part of a path."""

from __future__ import annotations

import re

from zenedge.errors import InvalidInput, InvalidName

# Profile and base names: what users type (`zenedge pull writer`). Lower-case keeps names
# portable across case-insensitive file systems; no separators, so a name is never a path.
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+-]{0,31}$")


def check_name(name: str, what: str = "name") -> str:
    """Return `name` if it is a valid profile/base name, else raise InvalidName."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        shown = repr(name)[:80]
        raise InvalidName(
            f"invalid {what} {shown}: use 1-64 characters a-z 0-9 . _ - starting with a letter or digit"
        )
    return name


def check_digest(digest: str) -> str:
    """Return a bare lower-case sha256 hex digest, accepting an optional `sha256:`/`sha256-` prefix."""
    if isinstance(digest, str):
        for prefix in ("sha256:", "sha256-"):
            if digest.startswith(prefix):
                digest = digest[len(prefix):]
        if _DIGEST.fullmatch(digest):
            return digest
    raise InvalidInput(f"invalid sha256 digest {str(digest)[:80]!r}")


def split_reference(ref: str) -> tuple[str, str | None]:
    """`writer:1.2.0` → ("writer", "1.2.0"); `writer` → ("writer", None)."""
    name, _, version = ref.partition(":")
    check_name(name, "profile name")
    if version and not _VERSION.fullmatch(version):
        raise InvalidName(f"invalid version {version!r} in {ref!r}")
    return name, version or None
