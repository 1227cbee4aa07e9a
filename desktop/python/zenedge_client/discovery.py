"""Finding the daemon a desktop app should talk to, by the daemon's own rules.

The home is ZENEDGE_HOME or platformdirs' user data dir for "zenedge"; a running daemon describes
itself in `<home>/daemon.json` (socket, TCP address, pid); the TCP token is ZENEDGE_TOKEN or
`<home>/token`. `discover()` checks /health before answering, so a stale daemon.json (a crash)
reads as "no daemon".
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from zenedge_client.client import ZenedgeClient, ZenedgeError


def default_home() -> Path:
    if os.environ.get("ZENEDGE_HOME"):
        return Path(os.environ["ZENEDGE_HOME"]).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "zenedge"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "zenedge" / "zenedge"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "zenedge"


def read_daemon_info(home: Optional[Path] = None) -> Optional[Dict[str, Any]]:
    try:
        return json.loads((Path(home or default_home()) / "daemon.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_token(home: Optional[Path] = None) -> Optional[str]:
    if os.environ.get("ZENEDGE_TOKEN"):
        return os.environ["ZENEDGE_TOKEN"]
    try:
        return (Path(home or default_home()) / "token").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def discover(home: Optional[Path] = None, *, prefer_tcp: bool = False, timeout: float = 2.0) -> Optional[ZenedgeClient]:
    """A client for the daemon running for `home`, or None."""
    home = Path(home or default_home())
    info = read_daemon_info(home)
    if not info:
        return None
    candidates = []
    if not prefer_tcp and info.get("socket") and Path(info["socket"]).exists():
        candidates.append(lambda: ZenedgeClient.unix(info["socket"]))
    token = read_token(home)
    if info.get("tcp") and token:
        candidates.append(lambda: ZenedgeClient.tcp(f"http://{info['tcp']}", token))
    for make in candidates:
        client = make()
        try:
            if client.health(timeout=timeout)["pid"] == info["pid"]:
                return client
        except ZenedgeError:
            pass
        client.close()
    return None
