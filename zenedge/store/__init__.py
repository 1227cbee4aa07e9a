"""The pool on disk: content-addressed blobs + a SQLite index, one writer at a time."""

from zenedge.store.store import NewAdapter, NewName, Store, Usage

__all__ = ["NewAdapter", "NewName", "Store", "Usage"]
