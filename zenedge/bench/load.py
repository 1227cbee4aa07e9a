"""Background load for benchmarks: busy processes that the benchmark starts, holds and stops itself,
so that a run measures a machine as users have it (a browser, a build or an indexer on some core)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator

# A plain busy loop, as `while :; do :; done` in a shell: all CPU, no memory traffic to speak of.
BUSY = "while True:\n    pass\n"


@contextlib.contextmanager
def background_load(processes: int) -> Iterator[list[subprocess.Popen]]:
    """`processes` busy processes while the block runs (0: none); they are killed at its end,
    whatever happens inside."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY], stdin=subprocess.DEVNULL)
            for _ in range(processes)]
    try:
        yield busy
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()


def describe(processes: int) -> str:
    return "quiet" if processes == 0 else f"{processes} busy process{'es' if processes > 1 else ''}"
