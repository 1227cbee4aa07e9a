"""Nothing on disk is trusted: a damaged index is never an empty pool, a damaged blob is never
served or merged, and `pool recover` rebuilds what it can without deleting anything."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import stat

import pytest

from zenedge import pool
from zenedge.errors import BlobDamaged, StoreCorrupt
from zenedge.pool.recover import recover
from zenedge.store import Store


@pytest.fixture
def filled(store, lora_factory, cfg, tmp_path):
    """The test store with two profiles (one with an eval set), and every file the home holds."""
    eval_set = tmp_path / "eval.jsonl"
    eval_set.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": f"a{i}"}) + "\n" for i in range(4)))
    pool.import_lora(store, cfg, lora_factory(seed=1), "writer", base="tiny", eval_path=eval_set)
    pool.import_lora(store, cfg, lora_factory(seed=2), "coder", base="tiny")
    store.close()
    return store.home


def files(home) -> set[str]:
    """The blobs and the bases' files: what a bad reconcile would delete."""
    return {str(p.relative_to(home)) for folder in ("blobs", "bases") for p in (home / folder).rglob("*") if p.is_file()}


def damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "empty":
        data = bytearray()
    elif how == "header":
        data[:16] = b"not sqlite at al"
    elif how == "truncated":
        data = data[: len(data) // 3]
    elif how == "pages":
        rng = random.Random(0)
        for page in range(1, len(data) // 4096):
            data[page * 4096: (page + 1) * 4096] = rng.randbytes(4096)
    path.write_bytes(bytes(data))
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["empty", "header", "truncated", "pages", "missing"])
def test_a_damaged_index_is_refused_and_nothing_is_deleted(filled, how):
    before = files(filled)
    index = filled / "index.db"
    if how == "missing":
        index.unlink()
        for suffix in ("-wal", "-shm"):
            index.with_name(index.name + suffix).unlink(missing_ok=True)
    else:
        damage(index, how)
    with pytest.raises(StoreCorrupt, match="pool recover") as refused:
        Store(filled)
    assert refused.value.exit_code == 65
    assert files(filled) == before                       # no reconcile ran: every blob and the base are there


def test_an_index_without_the_pools_tables_beside_blobs_is_refused(filled):
    index = filled / "index.db"
    index.unlink()
    for suffix in ("-wal", "-shm"):
        index.with_name(index.name + suffix).unlink(missing_ok=True)
    sqlite3.connect(index).execute("CREATE TABLE unrelated (x)").connection.commit()   # valid, but not ours
    with pytest.raises(StoreCorrupt, match="without the pool's tables"):
        Store(filled)


def test_a_fresh_home_is_an_empty_pool(isolated_home):
    store = Store(isolated_home)
    assert store.names() == [] and store.check() == []
    assert stat.S_IMODE(isolated_home.stat().st_mode) == 0o700


def test_an_open_home_is_made_private(tmp_path):
    home = tmp_path / "open"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    Store(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


@pytest.mark.parametrize("how", ["flip", "values"])
def test_a_damaged_blob_is_never_served_nor_merged_and_a_new_copy_heals_it(store, cfg, engine, lora_factory, how):
    import torch
    from safetensors.torch import load_file, save_file

    from zenedge.runtime.engine import Prompt
    from zenedge.runtime.generate import SamplingParams

    source = lora_factory(seed=3)
    adapter_id = pool.import_lora(store, cfg, source, "writer", base="tiny").adapter_id
    blob = store.blob_path(adapter_id)
    if how == "flip":
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        reason = "its bytes no longer match its sha256"
    else:  # huge numbers written into the tensors (outputs overflow to nothing)
        tensors = load_file(blob)
        for name in list(tensors)[:6]:
            tensors[name] = torch.full_like(tensors[name], 1e30)
        save_file(tensors, blob)
        reason = "its bytes no longer match its sha256"
    with pytest.raises(BlobDamaged, match=f"the stored adapter of 'writer' is damaged \\({reason}"):
        engine.complete("writer", Prompt(text="hi"), SamplingParams(max_tokens=2))
    assert any("'writer' is damaged" in problem for problem in store.check())
    pool.import_lora(store, cfg, source, "writer", base="tiny")             # the same file again
    assert store.check() == []
    assert engine.complete("writer", Prompt(text="hi"), SamplingParams(max_tokens=2)).completion_tokens == 2


def test_a_variant_with_non_finite_numbers_is_refused_at_load(store, cfg, engine, lora_factory):
    """A blob whose digest matches but whose numbers are not finite (stored by an older version
    that did not check) is refused too."""
    import torch
    from safetensors.torch import load_file, save_file

    from zenedge.runtime.engine import Prompt
    from zenedge.runtime.generate import SamplingParams

    adapter_id = pool.import_lora(store, cfg, lora_factory(seed=4), "writer", base="tiny").adapter_id
    tensors = load_file(store.blob_path(adapter_id))
    first = next(iter(tensors))
    tensors[first] = torch.full_like(tensors[first], float("nan"))
    save_file(tensors, store.blob_path(adapter_id))
    digest = __import__("hashlib").sha256(store.blob_path(adapter_id).read_bytes()).hexdigest()
    store.blob_path(adapter_id).rename(store.blob_path(digest))
    with store.db.atomic():   # the index as an older version would have written it
        store.conn.execute("PRAGMA foreign_keys=OFF")
        store.conn.execute("INSERT INTO blobs (digest, bytes, role, created_at) VALUES (?, ?, 'adapter', 0)",
                           [digest, store.blob_path(digest).stat().st_size])
        store.conn.execute("UPDATE adapters SET sha256 = ? WHERE id = ?", [digest, adapter_id])
    with pytest.raises(BlobDamaged, match="non-finite"):
        engine.complete("writer", Prompt(text="hi"), SamplingParams(max_tokens=2))


def test_recover_rebuilds_the_index_from_the_snapshot_and_keeps_the_old_one(filled, cfg):
    before = Store(filled).names()
    damage(filled / "index.db", "empty")
    report = recover(filled, cfg)
    assert report["from_snapshot"] and report["problems"] == [] and report["lost_and_found"] == []
    assert (filled / report["kept_index"]).exists()
    after = Store(filled).names()
    assert [(r["name"], r["adapter_id"]) for r in after] == [(r["name"], r["adapter_id"]) for r in before]
    assert Store(filled).name("writer")["eval_blob"]


def test_recover_without_a_snapshot_moves_what_nothing_describes_to_lost_and_found(filled, cfg):
    (filled / "index-snapshot.json").unlink()
    blobs = sorted(f"lost+found/{p.name}" for p in (filled / "blobs").iterdir())
    damage(filled / "index.db", "header")
    report = recover(filled, cfg)
    assert report["profiles"] == [] and report["bases"] == ["tiny"]      # the tiny profiles are in no registry
    assert sorted(report["lost_and_found"]) == blobs and len(blobs) == 3  # two adapters and an eval set
    assert all((filled / path).is_file() for path in report["lost_and_found"])
    assert Store(filled).check() == []
