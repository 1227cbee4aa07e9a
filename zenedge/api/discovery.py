"""Where a daemon listens, computed the same way by the daemon and by its clients (stdlib only).

- The Unix socket: `server.socket` from the config, else `<runtime dir>/zenedge.sock`. A socket
  path must fit sun_path (108 bytes on Linux, 104 on macOS, NUL included); a longer one falls back
  to `/tmp/zenedge-<uid>/<home id>.sock`, which both sides derive from the home.
- `<home>/daemon.json`: what the running daemon bound (socket, TCP address, pid), for desktop
  apps that know only the home. Not a secret; the token lives apart in `<home>/token` (0600).
- `home_id`: a hash of the home path. /health reports it so a client never talks to a daemon
  that serves another pool through a shared socket path.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zenedge.errors import Unavailable

SOCKET_NAME = "zenedge.sock"
# sun_path is 108 bytes on Linux and 104 on the BSDs/macOS, the terminating NUL included.
SUN_PATH_MAX = (104 if sys.platform == "darwin" or "bsd" in sys.platform else 108) - 1


@dataclass(frozen=True)
class SocketChoice:
    path: Path
    note: str | None = None  # why the configured/default path was not used


def home_id(home: Path) -> str:
    return hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:16]


def token_path(home: Path) -> Path:
    return Path(home) / "token"


def info_path(home: Path) -> Path:
    return Path(home) / "daemon.json"


def choose_socket(configured: str, runtime_dir: Path, home: Path) -> SocketChoice:
    """The socket path to use, falling back to a short one when the wanted path cannot be bound."""
    wanted = Path(configured).expanduser() if configured else Path(runtime_dir) / SOCKET_NAME
    size = len(os.fsencode(str(wanted)))
    if size <= SUN_PATH_MAX:
        return SocketChoice(wanted)
    short = Path("/tmp") / f"zenedge-{os.getuid()}" / f"{home_id(home)[:12]}.sock"
    return SocketChoice(short, note=(f"socket path {wanted} is {size} bytes, over the {SUN_PATH_MAX}-byte "
                                     f"limit for Unix sockets; using {short}"))


def socket_for(cfg) -> SocketChoice:
    """The socket of the daemon serving this config's home (what the CLI and `serve` both use)."""
    from zenedge import paths

    return choose_socket(cfg.server.socket, paths.runtime_dir(), paths.home())


def ensure_private_dir(directory: Path) -> Path:
    """Create `directory` 0700, or refuse one that another user could write into (a socket there
    could be swapped for theirs)."""
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise Unavailable(f"{directory} is not a directory")
    if info.st_uid != os.getuid():
        raise Unavailable(f"refusing to use {directory}: it belongs to uid {info.st_uid}, not to you",
                          hint="remove it or set server.socket to a path in a directory you own")
    if info.st_mode & 0o022:
        os.chmod(directory, 0o700)  # ours, but writable by others: tighten rather than refuse
    return directory


def read_info(home: Path) -> dict[str, Any] | None:
    """The running daemon's daemon.json, or None (absent or half-written)."""
    try:
        return json.loads(info_path(home).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
