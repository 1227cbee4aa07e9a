"""Where things live. The only module that reads zenedge's environment variables.

ZENEDGE_HOME    the pool (blobs, index, bases)     default: platformdirs user data dir
ZENEDGE_CONFIG  the TOML config file               default: platformdirs user config dir/config.toml
ZENEDGE_TOKEN   bearer token for the TCP listener  default: a generated 0600 file in the home
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "zenedge"


def home() -> Path:
    value = os.environ.get("ZENEDGE_HOME")
    return Path(value).expanduser() if value else Path(platformdirs.user_data_dir(APP))


def config_path() -> Path:
    value = os.environ.get("ZENEDGE_CONFIG")
    return Path(value).expanduser() if value else Path(platformdirs.user_config_dir(APP)) / "config.toml"


def runtime_dir() -> Path:
    """A private per-user directory for the daemon's socket (XDG_RUNTIME_DIR where there is one)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and Path(base).is_dir():
        return Path(base) / APP
    # No session runtime dir (containers, macOS): keep the socket inside the home, which is ours.
    return home() / "run"


def token_from_env() -> str | None:
    return os.environ.get("ZENEDGE_TOKEN") or None
