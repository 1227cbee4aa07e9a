"""What every command needs: the config (validated first, so a broken file changes nothing) and the store."""

from __future__ import annotations

from zenedge import config, paths
from zenedge.config import Config


def load_config() -> Config:
    return config.load(paths.config_path())


def open_store():
    from zenedge.store import Store

    return Store(paths.home())
