"""One writer at a time across processes: an advisory flock on `<home>/lock`.

Readers never take it (SQLite WAL lets them read the last committed state), so a long merge
holding the lock never blocks `zenedge list`. The lock file records the holder's pid for messages.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from zenedge.errors import StoreBusy


class WriterLock:
    def __init__(self, path: Path):
        self.path = path
        self._local = threading.RLock()  # serialises threads of this process too
        self._depth = 0
        self._fd: int | None = None

    @contextmanager
    def hold(self, timeout: float = 60.0) -> Iterator[None]:
        if not self._local.acquire(timeout=timeout):
            raise StoreBusy("the pool is busy in this process", hint="try again in a moment")
        try:
            if self._depth == 0:
                self._acquire_file(timeout)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._release_file()
        finally:
            self._local.release()

    @property
    def depth(self) -> int:
        """How deeply this process holds the lock now (0: not at all)."""
        return self._depth

    def _acquire_file(self, timeout: float) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self._holder()
                    os.close(fd)
                    raise StoreBusy(
                        f"another zenedge process{f' (pid {holder})' if holder else ''} is writing to the pool",
                        hint="wait for it to finish and try again",
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def _release_file(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def _holder(self) -> str | None:
        try:
            return self.path.read_text().strip() or None
        except OSError:
            return None
