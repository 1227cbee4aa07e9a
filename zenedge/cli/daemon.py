"""Finding a running daemon from the CLI, cheaply.

Commands that can go through the daemon (run, rm, budget set, ps) call `find_daemon()`. It costs
a stat of the socket path when no daemon runs, and one /health round trip over the socket (short
timeout) when one does; it imports only the stdlib client (no httpx, pydantic, FastAPI or torch).
"""

from __future__ import annotations

from zenedge import paths
from zenedge.api import discovery
from zenedge.api.client import DaemonClient, UnixTransport
from zenedge.config import Config
from zenedge.errors import ZenedgeError

HEALTH_TIMEOUT = 1.0


def find_daemon(cfg: Config | None = None, timeout: float = HEALTH_TIMEOUT) -> DaemonClient | None:
    """A client for the daemon serving this home, or None when none is running."""
    if cfg is None:
        from zenedge.cli.context import load_config

        cfg = load_config()
    path = discovery.socket_for(cfg).path
    if not path.exists():
        return None
    client = DaemonClient(UnixTransport(str(path)))
    try:
        health = client.health(timeout=timeout)
    except ZenedgeError:
        return None  # a stale socket of a crashed daemon, or one too busy to answer: work locally
    if health.get("home_id") != discovery.home_id(paths.home()):
        return None  # a daemon of another home on a shared socket path: never touch its pool
    return client
