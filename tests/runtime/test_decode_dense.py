"""Hot BitDelta variants on CPU: dense reconstructed weights give the packed path's logits, and
the dense copies live inside the delta cache's byte budget."""

import pytest
import torch

from tests.runtime.test_bitdelta_runtime import fine_tune_copy
from zenedge import pool
from zenedge.bitdelta import compress_model
from zenedge.runtime.cache import DeltaCache
from zenedge.runtime.dense_bitdelta import DenseBitDeltas, dense_nbytes


@pytest.fixture
def deltas(engine, store, cfg, tmp_path, tiny_base_dir):
    """Import BitDelta variants named d0, d1, …; returns name → get(cache) as the engine does it
    (keyed by adapter id, which is also the variant's key)."""
    def make(n):
        for i in range(n):
            ft = fine_tune_copy(tiny_base_dir, tmp_path / f"ft{i}", seed=10 + i)
            path = tmp_path / f"d{i}.bitdelta"
            compress_model(tiny_base_dir, ft, path, base_sha256=store.base("tiny")["sha256"])
            pool.import_bitdelta(store, cfg, path, f"d{i}", base="tiny")
        adapters = {f"d{i}": engine.router.route(f"d{i}").adapter for i in range(n)}
        return {name: (lambda cache, a=a: cache.get(a["id"], lambda: engine._load_variant(a)))
                for name, a in adapters.items()}
    return make


def logits(resident, variant, input_ids):
    with torch.inference_mode(), resident.state.using([variant] * input_ids.shape[0]):
        return resident.model(input_ids=input_ids).logits


def test_dense_weights_give_the_packed_paths_logits(engine, deltas):
    loaders = deltas(1)
    resident = engine.resident("tiny")
    cache = DeltaCache(1 << 30)
    dense = DenseBitDeltas(cache)
    variant = loaders["d0"](cache)
    packed_bytes = variant.nbytes
    input_ids = torch.randint(3, 99, (2, 9))
    packed = logits(resident, variant, input_ids)
    assert dense.prepare(variant, resident.model, "always") is variant
    assert all(m.dense is not None for m in variant.modules.values())
    assert variant.nbytes == packed_bytes + dense_nbytes(variant, resident.model)
    assert cache.used_bytes == variant.nbytes
    dense_logits = logits(resident, variant, input_ids)
    base = logits(resident, None, input_ids)
    assert (packed - base).abs().max() > 1e-3, "the delta must matter for this test to mean anything"
    assert (dense_logits - packed).abs().max() < 1e-5
    assert dense.prepare(variant, resident.model, "always") is variant and dense.densified == 1   # idempotent


def test_a_variant_whose_dense_copy_does_not_fit_stays_packed(engine, deltas):
    loaders = deltas(1)
    resident = engine.resident("tiny")
    probe = loaders["d0"](DeltaCache(1 << 30))
    need = probe.nbytes + dense_nbytes(probe, resident.model)
    cache = DeltaCache(need - 1)
    dense = DenseBitDeltas(cache)
    variant = dense.prepare(loaders["d0"](cache), resident.model, "always")
    assert all(m.dense is None for m in variant.modules.values())
    assert cache.used_bytes <= cache.budget and dense.dense_keys() == []


def test_the_hotter_variant_takes_the_dense_room(engine, deltas):
    loaders = deltas(2)
    resident = engine.resident("tiny")
    probe = loaders["d0"](DeltaCache(1 << 30))
    packed, extra = probe.nbytes, dense_nbytes(probe, resident.model)
    now = [0.0]
    cache = DeltaCache(2 * packed + extra, clock=lambda: now[0])   # room for exactly one dense copy
    dense = DenseBitDeltas(cache)
    cold = dense.prepare(loaders["d0"](cache), resident.model, "always")
    assert dense.dense_keys() == [cold.key]
    hot = None
    for _ in range(3):                                              # d1 is requested more often
        hot = dense.prepare(loaders["d1"](cache), resident.model, "always")
    assert dense.dense_keys() == [hot.key]
    assert all(m.dense is not None for m in hot.modules.values())
    assert all(m.dense is None for m in cold.modules.values()) and cold.nbytes == packed
    assert cache.used_bytes <= cache.budget
    # the colder variant asking again does not take the room back from the hotter one
    dense.prepare(loaders["d0"](cache), resident.model, "always")
    assert dense.dense_keys() == [hot.key] and cache.used_bytes <= cache.budget


def test_evicted_variants_are_forgotten(engine, deltas):
    loaders = deltas(1)
    resident = engine.resident("tiny")
    cache = DeltaCache(1 << 30)
    dense = DenseBitDeltas(cache)
    dense.prepare(loaders["d0"](cache), resident.model, "always")
    cache.drop(engine.router.route("d0").adapter["id"])
    assert dense.dense_keys() == []
    fresh = dense.prepare(loaders["d0"](cache), resident.model, "always")   # a reload densifies again
    assert all(m.dense is not None for m in fresh.modules.values()) and dense.densified == 2


def test_lora_and_plain_rows_are_left_alone(engine, imported):
    imported("w", seed=1)
    resident = engine.resident("tiny")
    dense = DenseBitDeltas(engine.cache)
    variant = engine.variant(engine.router.route("w"))
    before = variant.nbytes
    assert dense.prepare(variant, resident.model, "always") is variant and variant.nbytes == before
    assert dense.prepare(None, resident.model, "always") is None


@pytest.mark.parametrize("weights", ["full", "int4"])
def test_auto_makes_dense_copies_only_where_the_packed_path_has_no_c_kernel(store, tmp_path, deltas, weights):
    """runtime.bitdelta_dense: "never" keeps every BitDelta packed; "auto" densifies on fp32 weights
    (the packed path there is torch's) and not on the C int4 kernel's copies (the sign kernel
    serves it); "always" densifies wherever the budget has room."""
    from zenedge import config
    from zenedge.kernels import native
    from zenedge.runtime.engine import Engine
    from zenedge.runtime.layers import sign_kernel

    path = tmp_path / "config" / f"{weights}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'[runtime]\ndevice = "cpu"\ndtype = "float32"\nweights = "{weights}"\n')
    engine = Engine(store, config.load(path))
    loaders = deltas(1)
    resident = engine.resident("tiny")
    native_path = weights == "int4" and native.library() is not None
    for policy, densified in (("never", False), ("auto", not native_path), ("always", True)):
        cache = DeltaCache(1 << 30)
        variant = DenseBitDeltas(cache).prepare(loaders["d0"](cache), resident.model, policy)
        modules = list(variant.modules.values())
        assert all((m.dense is not None) == densified for m in modules), policy
        if policy == "auto" and native_path:
            assert all(sign_kernel(m) is not None for m in modules)
