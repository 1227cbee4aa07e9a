"""Spans of time people write in the config or the environment: finite seconds, bounded."""

from __future__ import annotations

from typing import Any

from zenedge.errors import InvalidInput

MAX_SECONDS = 365 * 24 * 3600   # a year: anything longer is a typo (and inf, nan, 1e400 are refused)


def parse_seconds(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_SECONDS:
        raise InvalidInput(f"expected a number of seconds from 0 to {MAX_SECONDS:,} (a year), got {v!r}")
    return float(v)


def parse_keep_alive(v: Any) -> float:
    """How long an on-demand daemon waits idle: 0 (never start one), or from 1 second to a year
    (a shorter wait would exit before the command that started it got its answer)."""
    seconds = parse_seconds(v)
    if 0 < seconds < 1:
        raise InvalidInput(f"expected 0 (never start a daemon) or at least 1 second, got {v!r}")
    return seconds
