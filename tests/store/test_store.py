
import pytest

from zenedge import config, pool
from zenedge.errors import AdapterNotFound, BudgetExceeded, InvalidName
from zenedge.store import Store


def cfg_with(tmp_path, text=""):
    path = tmp_path / "config" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return config.load(path)


def test_import_then_list_resolve_and_remove(store, lora_factory, tmp_path):
    cfg = cfg_with(tmp_path)
    result = pool.import_lora(store, cfg, lora_factory(seed=1), "writer", base="tiny")
    assert result.kind == "lora" and result.bytes > 0
    [entry] = store.names()
    assert entry["name"] == "writer" and entry["adapter_id"] == result.adapter_id
    assert store.resolve("writer")["rank"] == 4
    assert store.blob_path(result.adapter_id).is_file()
    assert store.used_bytes() == result.bytes
    freed = store.remove_name("writer")["freed_bytes"]
    assert freed == result.bytes
    assert store.names() == [] and store.used_bytes() == 0
    assert not store.blob_path(result.adapter_id).exists()
    assert store.check(budget=cfg.budget) == []


def test_same_content_is_stored_once_and_shared(store, lora_factory, tmp_path):
    cfg = cfg_with(tmp_path)
    path = lora_factory(seed=7)
    a = pool.import_lora(store, cfg, path, "one", base="tiny")
    b = pool.import_lora(store, cfg, path, "two", base="tiny")
    assert a.adapter_id == b.adapter_id
    assert store.used_bytes() == a.bytes
    store.remove_name("one")
    assert store.used_bytes() == a.bytes  # still serves "two"
    assert store.resolve("two")["id"] == a.adapter_id


def test_reimport_under_same_name_replaces(store, lora_factory, tmp_path):
    cfg = cfg_with(tmp_path)
    first = pool.import_lora(store, cfg, lora_factory(seed=1), "writer", base="tiny")
    second = pool.import_lora(store, cfg, lora_factory(seed=2), "writer", base="tiny")
    assert first.adapter_id != second.adapter_id
    assert [a["id"] for a in store.adapters()] == [second.adapter_id]
    assert store.check() == []


def test_import_over_budget_is_refused_and_changes_nothing(store, lora_factory, tmp_path):
    one = pool.import_lora(store, cfg_with(tmp_path), lora_factory(seed=1), "a", base="tiny")
    cfg = cfg_with(tmp_path, f'[pool]\nbudget = "{one.bytes + 100}B"\non_no_merge = "refuse"\n')
    with pytest.raises(BudgetExceeded) as info:
        pool.import_lora(store, cfg, lora_factory(seed=2), "b", base="tiny")
    assert "over" in str(info.value) and "zenedge rm" in str(info.value)
    assert [n["name"] for n in store.names()] == ["a"]
    assert len(list(store.blobs.digests())) == 1
    assert store.check(budget=cfg.budget) == []


def test_slot_limit_is_enforced(store, lora_factory, tmp_path):
    cfg = cfg_with(tmp_path, '[pool]\nmax_adapters = 2\non_no_merge = "refuse"\n')
    for i in range(2):
        pool.import_lora(store, cfg, lora_factory(seed=i), f"p{i}", base="tiny")
    with pytest.raises(BudgetExceeded, match="max_adapters"):
        pool.import_lora(store, cfg, lora_factory(seed=9), "p9", base="tiny")
    assert store.usage().adapters == 2


def test_unknown_name_says_how_to_pull(store):
    with pytest.raises(AdapterNotFound, match="zenedge pull ghost"):
        store.resolve("ghost")


@pytest.mark.parametrize("name", ["../x", "a/b", "a\\b", "", "A", "x\n", "-x", "a" * 65, ".hidden", "a..b"])
def test_names_that_could_become_paths_are_refused(store, lora_factory, tmp_path, name):
    with pytest.raises(InvalidName):
        pool.import_lora(store, cfg_with(tmp_path), lora_factory(), name, base="tiny")
    assert store.names() == []


def test_budget_lowering_evicts_least_requested_unpinned_first(store, lora_factory, tmp_path):
    cfg = cfg_with(tmp_path)
    ids = {}
    for i, name in enumerate(["cold", "warm", "hot", "pinned"]):
        ids[name] = pool.import_lora(store, cfg, lora_factory(seed=i), name, base="tiny")
    store.record_requests(ids["warm"].adapter_id, 3)
    store.record_requests(ids["hot"].adapter_id, 10)
    store.record_requests(ids["pinned"].adapter_id, 0)
    store.set_pinned("pinned", True)
    size = ids["cold"].bytes
    plan = pool.set_budget(store, cfg, f"{2 * size}B", dry_run=True)
    assert plan.names == ["cold", "warm"]
    assert len(store.names()) == 4  # dry run changed nothing
    plan = pool.set_budget(store, cfg, f"{2 * size}B")
    assert sorted(n["name"] for n in store.names()) == ["hot", "pinned"]
    assert config.load(cfg.path).budget == 2 * size
    assert store.check(budget=2 * size) == []


def test_budget_below_pinned_is_refused(store, lora_factory, tmp_path):
    cfg = cfg_with(tmp_path)
    a = pool.import_lora(store, cfg, lora_factory(seed=1), "a", base="tiny")
    store.set_pinned("a", True)
    with pytest.raises(BudgetExceeded, match="pinned"):
        pool.set_budget(store, cfg, f"{a.bytes - 1}B")
    assert config.load(cfg.path).budget == 4 * 2**30
    assert len(store.names()) == 1


def test_config_pinned_names_are_never_evicted(store, lora_factory, tmp_path):
    cfg = cfg_with(tmp_path, '[runtime]\npinned = ["keep"]\n')
    keep = pool.import_lora(store, cfg, lora_factory(seed=1), "keep", base="tiny")
    pool.import_lora(store, cfg, lora_factory(seed=2), "other", base="tiny")
    pool.set_budget(store, cfg, f"{keep.bytes}B")
    assert [n["name"] for n in store.names()] == ["keep"]


def test_pinned_is_the_pin_command_or_the_config_asked_in_one_place(store, lora_factory, tmp_path):
    cfg = cfg_with(tmp_path, '[runtime]\npinned = ["by-config", "not-pulled"]\n')
    ids = {name: pool.import_lora(store, cfg, lora_factory(seed=i), name, base="tiny").adapter_id
           for i, name in enumerate(["by-command", "by-config", "free"])}
    store.set_pinned("by-command", True)
    assert store.pinned_ids(cfg.runtime.pinned) == {ids["by-command"], ids["by-config"]}
    assert [a["id"] for a in store.eviction_order(pinned_names=cfg.runtime.pinned)] == [ids["free"]]
    # The config's pins are read, not copied into the store: a name taken out of the config is free again.
    assert store.pinned_ids(cfg_with(tmp_path).runtime.pinned) == {ids["by-command"]}

def test_decayed_rate_orders_by_recency_of_requests(store, lora_factory, tmp_path):
    cfg = cfg_with(tmp_path)
    old = pool.import_lora(store, cfg, lora_factory(seed=1), "old", base="tiny").adapter_id
    new = pool.import_lora(store, cfg, lora_factory(seed=2), "new", base="tiny").adapter_id
    now = 1_000_000_000.0
    store.record_requests(old, 8, now=now - 7 * 24 * 3600)   # many requests a week ago
    store.record_requests(new, 2, now=now)                    # few requests now
    assert [a["id"] for a in store.eviction_order(now=now)] == [old, new]


def test_events_record_what_happened(store, lora_factory, tmp_path):
    pool.import_lora(store, cfg_with(tmp_path), lora_factory(), "writer", base="tiny")
    store.remove_name("writer")
    kinds = [e["kind"] for e in store.events()]
    assert kinds[:2] == ["rm", "import"]


def test_reconcile_removes_crash_leftovers(store, lora_factory, tmp_path):
    pool.import_lora(store, cfg_with(tmp_path), lora_factory(), "writer", base="tiny")
    dead = store.blobs.tmp_root / "999999-dead"  # a staging dir whose process is gone: nobody holds it
    dead.mkdir()
    (dead / "blob-partial").write_bytes(b"half")
    (store.blobs.tmp / "in-use").write_bytes(b"ours")  # this live store's staging: not a leftover
    orphan = "ab" * 32
    store.blobs.path(orphan).write_bytes(b"orphan")
    (store.bases_dir / "half-base").mkdir()
    problems = store.check()
    assert any("orphan blob" in p for p in problems) and any("temporary" in p for p in problems)
    Store(store.home)  # start-up reconciles
    assert store.check() == []
    [event] = [e for e in store.events() if e["kind"] == "reconcile"]
    assert event["detail"]["tmp"] == 1 and event["detail"]["orphan_blobs"] == 1
    assert event["detail"]["orphan_bases"] == 1
    assert store.resolve("writer")
    assert not dead.exists() and (store.blobs.tmp / "in-use").exists()


def test_check_detects_a_missing_or_corrupt_blob(store, lora_factory, tmp_path):
    result = pool.import_lora(store, cfg_with(tmp_path), lora_factory(), "writer", base="tiny")
    path = store.blob_path(result.adapter_id)
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert store.check() == ["the stored adapter of 'writer' is damaged (its bytes no longer match its sha256, "
                             f"sha256 {result.adapter_id[:12]})"]
    path.unlink()
    assert any("missing blob" in p for p in store.check())


def test_among_equally_requested_adapters_the_one_serving_fewer_profiles_goes_first(store, lora_factory, tmp_path):
    from zenedge.store import NewAdapter, NewName

    cfg = cfg_with(tmp_path)
    shared = store.put_adapter(NewAdapter(kind="merged", base="tiny", weights=lora_factory(seed=1) / "adapter_model.safetensors"),
                               [NewName("a"), NewName("b")], budget=cfg.budget)
    single = pool.import_lora(store, cfg, lora_factory(seed=2), "c", base="tiny").adapter_id
    assert [a["id"] for a in store.eviction_order()] == [single, shared]   # older, but serves two
    store.record_requests(single, 3)
    assert [a["id"] for a in store.eviction_order()] == [shared, single]   # requests come first
