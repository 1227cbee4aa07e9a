"""Binding the daemon's sockets ourselves (uvicorn would make a Unix socket 0666)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from zenedge.api import discovery
from zenedge.errors import Unavailable

BACKLOG = 128


@dataclass
class UnixListener:
    path: Path
    sock: socket.socket
    inode: int

    def remove(self) -> None:
        """Unlink the socket file, unless a successor has already replaced it with its own."""
        try:
            if self.path.lstat().st_ino == self.inode:
                self.path.unlink()
        except FileNotFoundError:
            pass


def bind_unix(path: Path, *, private_dir: bool) -> UnixListener:
    """A listening Unix socket, mode 0600 from the moment it exists (bound under umask 0177)."""
    if private_dir:
        discovery.ensure_private_dir(path.parent)
    else:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise Unavailable(f"cannot listen on {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(BACKLOG)
    return UnixListener(path, sock, path.lstat().st_ino)


def bind_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise Unavailable(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                          hint="another program may use that port; pick another with --tcp HOST:PORT") from None
    sock.listen(BACKLOG)
    return sock
