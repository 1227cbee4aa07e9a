"""One daemon per home, and no stale socket left in the way (stdlib only: a refused second
`zenedge serve` answers before torch or FastAPI are imported).

The home's `daemon.lock` is held (flock) for the daemon's whole life; the kernel drops it when the
process dies, however it dies, so a crash never leaves a stale lock. A socket file is different:
it survives a crash. With the lock held, a socket that refuses connections is a crashed daemon's
and is replaced; one that answers belongs to a daemon of another home (same configured path), and
is left alone.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from zenedge.api import discovery
from zenedge.api.client import DaemonClient, UnixTransport
from zenedge.errors import Unavailable, ZenedgeError
from zenedge.server.errors import AlreadyRunning

PROBE_TIMEOUT = 2.0
HANDOVER_MARGIN = 30.0   # seconds past the old daemon's grace period for it to exit (its last cleanup)


@dataclass
class Claim:
    fd: int
    lock_path: Path
    notes: list[str]

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def probe(socket_path: Path, timeout: float = PROBE_TIMEOUT) -> dict | None:
    """/health over the socket, or None when nothing answers there."""
    try:
        return DaemonClient(UnixTransport(str(socket_path)), timeout=timeout).health()
    except ZenedgeError:
        return None


def listening(socket_path: Path, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether some process accepts connections on this socket (a crashed daemon's refuses them)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(socket_path))
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # e.g. a full backlog: alive but busy; never steal a live socket
    finally:
        sock.close()


def _running_message(home: Path, socket_path: Path) -> str:
    info = discovery.read_info(home) or {}
    where = info.get("socket") or str(socket_path)
    health = probe(Path(where))
    if health:
        return f"a zenedge daemon is already running for this home (pid {health.get('pid')}, socket {where})"
    pid = info.get("pid", "unknown")
    return (f"another zenedge daemon (pid {pid}) holds {home / 'daemon.lock'} but does not answer on {where}; "
            "it may still be starting or be stuck")


def take_over(home: Path, socket_path: Path, say: Callable[[str], None]) -> Claim:
    """`claim`, for a daemon that is meant to stay (`zenedge serve`): a daemon that a command started
    on demand (it exits when idle) is asked to hand over: it finishes its requests in flight and
    exits, and this one claims the home. A daemon started by `zenedge serve` is never displaced."""
    asked: set[int] = set()
    deadline = None
    while True:
        try:
            return claim(home, socket_path)
        except AlreadyRunning as refused:
            info = discovery.read_info(home) or {}
            where = Path(info.get("socket") or socket_path)
            health = probe(where)
            if health is not None and not health.get("on_demand"):
                raise AlreadyRunning(f"{refused.message}, started by `zenedge serve`",
                                     hint="use it, or stop it first with `zenedge stop`") from None
            if health is not None and health.get("pid") not in asked:
                pid = health.get("pid")
                say(f"taking over from the zenedge daemon a command started (pid {pid}): it finishes its "
                    "requests in flight, then exits")
                answer = DaemonClient(UnixTransport(str(where)), timeout=PROBE_TIMEOUT).stop()
                asked.add(pid)
                deadline = time.monotonic() + answer.get("grace_seconds", 10.0) + HANDOVER_MARGIN
            elif deadline is None:                 # holding the lock without answering: starting or stuck
                deadline = time.monotonic() + HANDOVER_MARGIN
            if time.monotonic() > deadline:
                raise AlreadyRunning(f"{refused.message}; it did not hand over",
                                     hint="stop it with `zenedge stop`, then start `zenedge serve` again") from None
            time.sleep(0.1)


def claim(home: Path, socket_path: Path) -> Claim:
    """Become the daemon of `home`, or raise AlreadyRunning with one line saying who is."""
    home.mkdir(parents=True, exist_ok=True)
    lock_path = home / "daemon.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(_running_message(home, socket_path)) from None
    notes = []
    try:
        notes += _clear_socket(socket_path, home)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return Claim(fd, lock_path, notes)


def _clear_socket(socket_path: Path, home: Path) -> list[str]:
    try:
        info = socket_path.lstat()
    except FileNotFoundError:
        return []
    except OSError as exc:  # e.g. a file where its directory should be
        raise Unavailable(f"cannot use {socket_path} as the daemon's socket: {exc.strerror}",
                          hint="set server.socket to a path in a directory you own") from None
    if not stat.S_ISSOCK(info.st_mode):
        raise Unavailable(f"{socket_path} exists and is not a socket; refusing to replace it",
                          hint="remove it or set server.socket to another path")
    if listening(socket_path):
        health = probe(socket_path)
        who = f"another zenedge daemon (pid {health.get('pid')}) serving a different home" if health \
            else "another process"
        raise AlreadyRunning(f"{socket_path} is in use by {who}",
                             hint="set server.socket in this home's config to another path")
    socket_path.unlink(missing_ok=True)
    return [f"removed a stale socket {socket_path} left by a daemon that did not shut down cleanly"]
