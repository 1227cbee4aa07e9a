"""Byte sizes as people write them: "16GB" = 16·10⁹, "16GiB" = 16·2³⁰, "123B", or a bare integer."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from zenedge.errors import InvalidInput

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15,
}
MAX_SIZE = 10**15   # 1 PB: no disk or memory budget is larger; anything above is a typo (and 2⁶³ overflows SQLite)
_HINT = 'write e.g. "16GB", "16GiB", "500MB" or "123B"'
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int | float) -> int:
    """Parse a size into bytes; raise InvalidInput with a hint on anything else.

    Exact, in decimal: a fraction of a unit is fine when it makes whole bytes ("1.5KB" = 1500),
    never rounded to one ("1.5" or "0.5B" are refused: rounding 0.5B to 0 once evicted a whole pool).
    """
    if isinstance(text, bool):
        raise InvalidInput(f"invalid size {text!r}", hint=_HINT)
    if isinstance(text, float):  # a TOML number such as `budget = 1.5` or `budget = 1e9`
        if not math.isfinite(text):
            raise InvalidInput(f"invalid size {text!r}", hint=_HINT)
        if not text.is_integer():
            raise InvalidInput(f"invalid size {text!r}: not a whole number of bytes", hint=_HINT)
        text = int(text)
    if isinstance(text, int):
        if text < 0:
            raise InvalidInput(f"invalid size {text}: must not be negative")
        return _at_most_max(text, text)
    match = _SIZE.fullmatch(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise InvalidInput(f"invalid size {text!r}", hint=_HINT)
    size = Decimal(match.group(1)) * _UNITS[unit]
    if size != size.to_integral_value():
        raise InvalidInput(f"invalid size {text!r}: {size.normalize():f} is not a whole number of bytes", hint=_HINT)
    return _at_most_max(int(size), text)


def _at_most_max(size: int, text) -> int:
    if size > MAX_SIZE:
        raise InvalidInput(f"invalid size {text!r}: more than 1 PB", hint="sizes go up to 1PB")
    return size


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
