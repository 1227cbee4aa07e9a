"""Byte sizes as people write them: "16GB" = 16·10⁹, "16GiB" = 16·2³⁰, "123B", or a bare integer."""

from __future__ import annotations

import re

from zenedge.errors import InvalidInput

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse a size into bytes; raise InvalidInput with a hint on anything else."""
    if isinstance(text, bool):
        raise InvalidInput(f"invalid size {text!r}", hint='write e.g. "16GB", "16GiB", "500MB" or "123B"')
    if isinstance(text, int):
        if text < 0:
            raise InvalidInput(f"invalid size {text}: must not be negative")
        return text
    match = _SIZE.fullmatch(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise InvalidInput(f"invalid size {text!r}", hint='write e.g. "16GB", "16GiB", "500MB" or "123B"')
    return int(round(float(match.group(1)) * _UNITS[unit]))


def format_size(n: int) -> str:
    """Human-readable, binary units (what `du -h` users expect), exact for small values."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")
