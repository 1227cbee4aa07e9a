"""The pool's profiles as `zenedge list` and the daemon's GET /api/list show them."""

from __future__ import annotations

from typing import Any

from zenedge.config import Config
from zenedge.store import Store


def entries(store: Store, cfg: Config) -> list[dict[str, Any]]:
    """One entry per name: what serves it, how big, shared with how many names, pinned (by
    `zenedge pin` or by the config), its version ("" when unversioned) and use."""
    pinned = store.pinned_ids(cfg.runtime.pinned)
    return [{
        "name": row["name"], "kind": row["kind"], "bytes": row["bytes"], "base": row["base"],
        "served_by": row["adapter_id"][:12], "shared_with": row["sharing"] - 1, "pinned": row["adapter_id"] in pinned,
        "version": row["version"] or "", "requests": row["request_count"], "last_used_at": row["last_used_at"],
        "compressed_to": row["compressed_to"],
    } for row in store.names()]
