import sqlite_utils
import pytest

from zenedge.store import migrations
from zenedge.store.store import Store


def test_fresh_store_applies_every_migration(isolated_home):
    store = Store(isolated_home)
    assert migrations.pending_migrations(store.conn) == []
    assert {"bases", "adapters", "names", "merges", "events", "blobs"} <= set(store.db.table_names())


def test_failing_migration_rolls_back_and_stays_pending(tmp_path, monkeypatch):
    db = sqlite_utils.Database(tmp_path / "index.db")
    migrations.migrate(db)

    def m999_broken(db):
        db["half_done"].create({"x": int})
        raise RuntimeError("boom")

    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS + [("m999_broken", m999_broken)])
    with pytest.raises(RuntimeError):
        migrations.migrate(db)
    assert "half_done" not in db.table_names()
    assert migrations.pending_migrations(db.conn) == ["m999_broken"]


def test_migrations_are_idempotent(tmp_path):
    db = sqlite_utils.Database(tmp_path / "index.db")
    assert migrations.migrate(db) == [name for name, _ in migrations.MIGRATIONS]
    assert migrations.migrate(db) == []


def test_an_old_pool_is_upgraded_in_place(isolated_home, monkeypatch):
    first_only = migrations.MIGRATIONS[:1]
    isolated_home.mkdir(parents=True)
    db = sqlite_utils.Database(isolated_home / "index.db")
    monkeypatch.setattr(migrations, "MIGRATIONS", first_only)
    migrations.migrate(db)
    db["bases"].insert({"name": "old", "sha256": "a" * 64, "dir": "bases/old", "bytes": 1, "modules": "{}",
                        "aliases": "[]", "source": "", "created_at": 0.0})
    db.close()
    monkeypatch.undo()
    store = Store(isolated_home)
    assert migrations.pending_migrations(store.conn) == []
    row = store.base("old")
    assert row["sha256"] == "a" * 64 and "weights_sha256" in row
