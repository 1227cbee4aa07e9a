"""What a daemon was started with, resolved once at start-up (stdlib only).

Everything that depends on the environment (home, config path, socket, token) is read here, once,
so a daemon keeps serving the pool it started with whatever the process environment does later.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from zenedge import paths
from zenedge.api import discovery
from zenedge.config import Config
from zenedge.errors import InvalidInput

_TCP = re.compile(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})")


@dataclass(frozen=True)
class Settings:
    home: Path
    config_path: Path
    socket: Path
    socket_is_default: bool                  # ours to keep private (a configured path may be shared)
    notes: tuple[str, ...] = ()              # things the user should know (e.g. a socket fallback)
    tcp: tuple[str, int] | None = None
    allow_remote: bool = False
    token: str | None = field(default=None, repr=False)
    token_source: str = ""
    grace_seconds: float = 10.0
    max_batch: int = 8
    max_body_bytes: int = 1 << 20
    config_poll_seconds: float = 2.0
    idle_exit_seconds: float = 0.0           # exit after this long without a request (0: never)


def parse_tcp(value: str) -> tuple[str, int]:
    match = _TCP.fullmatch(value.strip())
    if not match or int(match.group(2)) > 65535:
        raise InvalidInput(f"invalid TCP address {value!r}", hint='write HOST:PORT, e.g. "127.0.0.1:11435"')
    return match.group(1).strip("[]"), int(match.group(2))


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a DNS name other than localhost may resolve anywhere


def load_or_create_token(home: Path) -> tuple[str, str]:
    """(token, where it came from): ZENEDGE_TOKEN, else <home>/token, created 0600 on first use."""
    from_env = paths.token_from_env()
    if from_env:
        return from_env, "ZENEDGE_TOKEN"
    path = discovery.token_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        # Write a complete 0600 file aside, then link it into place: a concurrent reader sees either
        # no token file or a whole one, and of two racing daemons exactly one token wins.
        tmp = path.with_name(f".token-{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)  # a token others can read is not a secret: tighten it
    token = path.read_text(encoding="utf-8").strip()
    if not token:
        raise InvalidInput(f"the token file {path} is empty", hint="delete it; a new one is made on start")
    return token, str(path)


def resolve(cfg: Config, *, socket: str | None = None, tcp: str | None = None, allow_remote: bool = False,
            grace_seconds: float = 10.0, config_poll_seconds: float = 2.0, idle_exit_seconds: float = 0.0) -> Settings:
    home = paths.home()
    configured = socket if socket is not None else cfg.server.socket
    choice = discovery.choose_socket(configured, paths.runtime_dir(), home)
    tcp_value = tcp if tcp is not None else cfg.server.tcp
    address = parse_tcp(tcp_value) if tcp_value else None
    if address and not is_loopback(address[0]) and not allow_remote:
        raise InvalidInput(f"{address[0]} is not a loopback address: listening there exposes the daemon to "
                           "the network", hint="pass --allow-remote to do it anyway (a client off this machine always needs the token)")
    token, source = load_or_create_token(home) if address else (None, "")
    return Settings(home=home, config_path=cfg.path, socket=choice.path,
                    socket_is_default=not configured or choice.note is not None,
                    notes=(choice.note,) if choice.note else (), tcp=address, allow_remote=allow_remote,
                    token=token, token_source=source, grace_seconds=grace_seconds,
                    config_poll_seconds=config_poll_seconds, idle_exit_seconds=idle_exit_seconds)
