"""The delta cache: single-flight loads, rate-weighted LRU under a byte budget, pinned variants."""

import threading
import time

import pytest

from zenedge.runtime.cache import DeltaCache
from zenedge.runtime.variants import Variant


def variant(key, nbytes=100):
    return Variant(key, "lora", {}, nbytes)


def test_sixteen_concurrent_requests_cause_exactly_one_load():
    cache = DeltaCache(10_000)
    calls = []
    gate = threading.Event()

    def load():
        calls.append(1)
        gate.wait(5)
        return variant("x")

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("x", load, name="w"))) for _ in range(16)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join()
    assert len(calls) == 1 and cache.loads == 1
    assert len(results) == 16 and all(r is results[0] for r in results)
    assert cache.snapshot()[0]["requests"] == 16


def test_a_failed_load_reaches_every_waiter_and_is_retried_later():
    cache = DeltaCache(10_000)
    gate = threading.Event()

    def broken():
        gate.wait(5)
        raise OSError("disk gone")

    errors = []

    def worker():
        try:
            cache.get("x", broken)
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    gate.set()
    for t in threads:
        t.join()
    assert len(errors) == 4
    assert cache.get("x", lambda: variant("x")).key == "x"


def test_eviction_prefers_low_request_rate():
    now = [0.0]
    cache = DeltaCache(300, keep_top=0, clock=lambda: now[0])
    for _ in range(5):
        cache.get("hot", lambda: variant("hot"))
    cache.get("cold", lambda: variant("cold"))
    cache.get("warm", lambda: variant("warm"))
    cache.get("warm", lambda: variant("warm"))
    now[0] += 1
    cache.get("new", lambda: variant("new"))
    assert "cold" not in cache and {"hot", "warm", "new"} <= {e["key"] for e in cache.snapshot()}
    assert cache.used_bytes <= 300


def test_pinned_variants_and_top_rate_survive():
    cache = DeltaCache(200, pinned=lambda: {"p"}, keep_top=1)
    cache.get("p", lambda: variant("p"), name="writer")
    for _ in range(3):
        cache.get("top", lambda: variant("top"))
    cache.get("other", lambda: variant("other"))
    keys = {e["key"] for e in cache.snapshot()}
    assert {"p", "top"} <= keys or "other" in keys  # budget 200 holds two: the newest is protected
    cache.get("more", lambda: variant("more"))
    keys = {e["key"] for e in cache.snapshot()}
    assert "p" in keys  # pinned never leaves


@pytest.mark.parametrize("budget", [0, 50])
def test_a_variant_larger_than_the_budget_is_still_served(budget):
    cache = DeltaCache(budget)
    assert cache.get("big", lambda: variant("big", 100)).key == "big"


def test_a_profile_pinned_with_zenedge_pin_stays_in_the_engine_cache(store, cfg, imported):
    """Regression: the delta cache honoured only the config's runtime.pinned, so a variant pinned
    with `zenedge pin` (the store's column) was evicted from memory like any other."""
    from tests.conftest import run_cli
    from zenedge.runtime.engine import Engine

    for seed, name in enumerate(("kept", "busy")):
        imported(name, seed)
    run_cli("pin", "kept", check=True)
    engine = Engine(store, cfg)
    engine.variant(engine.router.route("kept"))
    engine.cache.set_budget(engine.cache.used_bytes)  # room for one variant
    for _ in range(3):
        engine.variant(engine.router.route("busy"))  # newer and more requested: "kept" would go first
    assert store.resolve("kept")["id"] in engine.cache and store.resolve("busy")["id"] in engine.cache
