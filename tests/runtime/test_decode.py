"""The lean decode loop (static cache) against the reference loop (transformers' DynamicCache):
same tokens, same text, same finish reasons, for plain, LoRA and BitDelta rows and mixed batches."""

import threading

import pytest
import torch

from tests.runtime.test_bitdelta_runtime import fine_tune_copy
from zenedge import pool
from zenedge.bitdelta import compress_model
from zenedge.runtime import decode, static_cache
from zenedge.runtime.engine import Prompt
from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
from zenedge.runtime.static_cache import StaticKVCache

PROMPTS = ["hello", "a much longer prompt than the first one", "mid size", "x"]


@pytest.fixture
def variants(engine, store, cfg, imported, tmp_path, tiny_base_dir):
    """name → Variant | None: the plain base, two LoRAs and a BitDelta."""
    imported("lora-a", seed=1)
    imported("lora-b", seed=2, targets=("q_proj", "v_proj"), r=2)
    ft = fine_tune_copy(tiny_base_dir, tmp_path / "ft", seed=5)
    delta = tmp_path / "d.bitdelta"
    compress_model(tiny_base_dir, ft, delta, base_sha256=store.base("tiny")["sha256"])
    pool.import_bitdelta(store, cfg, delta, "delta", base="tiny")
    return {name: engine.variant(engine.router.route(name)) for name in ("tiny", "lora-a", "lora-b", "delta")}


def encode(engine, text):
    return Prompt(messages=[{"role": "user", "content": text}]).encode(engine.resident("tiny").tokenizer)


def run(resident, requests, stepper):
    """Every step's deltas as plain tuples, so two runs compare with ==."""
    return [[(d.index, d.text, d.token_id, d.finish_reason) for d in deltas]
            for deltas in generate(resident, requests, stepper=stepper)]


def test_static_loop_equals_reference_on_a_mixed_batch(engine, variants):
    resident = engine.resident("tiny")
    names = ["lora-a", "tiny", "delta", "lora-b", "delta"]
    requests = [GenerationRequest(encode(engine, PROMPTS[i % 4]), variants[n], SamplingParams(max_tokens=12 + i))
                for i, n in enumerate(names)]
    ours = run(resident, requests, "auto")
    reference = run(resident, requests, "dynamic")
    assert ours == reference
    assert len(ours) >= 12 and all(token is not None for step in ours for _, _, token, _ in step)


@pytest.mark.parametrize("name", ["tiny", "lora-a", "delta", "delta-packed"])
def test_static_loop_equals_reference_for_one_variant(engine, variants, name):
    resident = engine.resident("tiny")
    if name == "delta-packed":   # the engine densified it (CPU, room in the budget): go back to packed
        engine.dense.drop_all()
        assert all(m.dense is None for m in variants["delta"].modules.values())
        name = "delta"
    requests = [GenerationRequest(encode(engine, p), variants[name], SamplingParams(max_tokens=10)) for p in PROMPTS[:2]]
    assert run(resident, requests, "auto") == run(resident, requests, "dynamic")


def test_fixed_shape_steps_equal_the_reference(engine, variants):
    """The eager form of what a CUDA graph captures (whole buffers, device-side mask and
    positions), checked on CPU: same tokens as the reference."""
    resident = engine.resident("tiny")
    names = ["lora-a", "tiny", "delta", "lora-b"]
    requests = [GenerationRequest(encode(engine, PROMPTS[i]), variants[n], SamplingParams(max_tokens=9 + i))
                for i, n in enumerate(names)]
    assert run(resident, requests, "fixed") == run(resident, requests, "dynamic")
    assert resident.kv_pool._idle[True].full_views


def test_sampling_stop_strings_and_seeds_match_the_reference(engine, variants):
    resident = engine.resident("tiny")
    full = run(resident, [GenerationRequest(encode(engine, "hi"), None, SamplingParams(max_tokens=24, temperature=1.0, seed=7))],
               "dynamic")
    text = "".join(t for step in full for _, t, _, _ in step)
    assert len(text) >= 6
    params = [SamplingParams(max_tokens=24, temperature=1.0, seed=7, stop=(text[3:5],)),
              SamplingParams(max_tokens=20, temperature=0.7, top_p=0.9, seed=3),
              SamplingParams(max_tokens=5)]
    requests = [GenerationRequest(encode(engine, "hi"), variants[n], p)
                for n, p in zip(("tiny", "lora-a", "delta"), params)]
    ours = run(resident, requests, "auto")
    assert ours == run(resident, requests, "dynamic")
    reasons = {i: r for step in ours for i, _, _, r in step if r}
    assert reasons[0] == "stop" and reasons[2] == "length"


def test_cancellation_ends_one_row_in_the_static_loop(engine, variants):
    resident = engine.resident("tiny")
    stop_first = threading.Event()
    requests = [GenerationRequest(encode(engine, "hi"), variants["lora-a"], SamplingParams(max_tokens=8), stop_first),
                GenerationRequest(encode(engine, "hi"), variants["delta"], SamplingParams(max_tokens=8))]
    reasons, counts = {}, {0: 0, 1: 0}
    for step, deltas in enumerate(generate(resident, requests)):
        if step == 1:
            stop_first.set()
        for d in deltas:
            counts[d.index] += 1
            reasons[d.index] = d.finish_reason or reasons.get(d.index)
    assert reasons[0] == "cancelled" and counts[0] == 3
    assert reasons[1] in {"length", "stop"}


def test_the_static_cache_is_reused_across_requests(engine, variants):
    resident = engine.resident("tiny")
    requests = [GenerationRequest(encode(engine, "hello"), variants["lora-a"], SamplingParams(max_tokens=6))]
    first = run(resident, requests, "auto")
    pool = resident.kv_pool
    cache = pool._idle[False]
    assert cache.allocations == 1 and pool.idle_bytes > 0
    second = run(resident, requests, "auto")
    assert second == first
    assert pool._idle[False] is cache and cache.allocations == 1   # nothing allocated the second time


def test_the_cache_grows_mid_request_without_changing_the_output(engine, variants, monkeypatch):
    monkeypatch.setattr(decode, "INITIAL_NEW_TOKENS", 2)
    monkeypatch.setattr(static_cache, "CAPACITY_STEP", 4)
    resident = engine.resident("tiny")
    resident.kv_pool.release()
    requests = [GenerationRequest(encode(engine, p), variants["lora-a"], SamplingParams(max_tokens=30)) for p in PROMPTS[:2]]
    ours = run(resident, requests, "auto")
    assert resident.kv_pool._idle[False].allocations > 1                  # it did grow
    assert ours == run(resident, requests, "dynamic")


def test_concurrent_requests_on_one_resident_do_not_mix(engine, variants):
    resident = engine.resident("tiny")
    jobs = [[GenerationRequest(encode(engine, p), variants[n], SamplingParams(max_tokens=10))]
            for p, n in zip(PROMPTS, ("lora-a", "delta", "tiny", "lora-b"))]
    alone = [run(resident, job, "auto") for job in jobs]
    together = [None] * len(jobs)

    def work(i):
        together[i] = run(resident, jobs[i], "auto")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


def test_models_with_sliding_windows_fall_back_to_the_reference(engine):
    resident = engine.resident("tiny")
    assert decode.static_cache_supported(resident.model)
    config = resident.model.config
    config.sliding_window, config.use_sliding_window = 16, True
    try:
        assert not decode.static_cache_supported(resident.model)
        requests = [GenerationRequest(encode(engine, "hi"), None, SamplingParams(max_tokens=4))]
        with decode.open_stepper(resident, decode.RowVariants.build([None], resident.device), 8, 4) as stepper:
            assert isinstance(stepper, decode.DynamicStepper)
        assert run(resident, requests, "auto")                          # still serves
    finally:
        config.sliding_window = None


def test_the_decode_path_says_what_the_loop_runs(engine, tiny_base_dir):
    """decode_path reports the stepper open_stepper picks and the forward _Forward uses, and why
    the lean forward is not used where it is not; a model's skeleton (no weights) reports the same."""
    from zenedge.kernels import native
    from zenedge.runtime import lean_llama
    from zenedge.runtime.model import skeleton

    resident = engine.resident("tiny")
    path = decode.decode_path(resident.model, resident.device, resident.weights)
    assert (path.stepper, path.forward, path.weights, path.lean_refused) == ("static", "lean", "full", None)
    assert path.native_kernels == (native.library() is not None)
    assert path.native_kernels_off == native.off_reason()
    assert decode.decode_path(skeleton(tiny_base_dir), resident.device, "full") == path
    with decode.open_stepper(resident, decode.RowVariants.build([None], resident.device), 8, 4) as stepper:
        assert isinstance(stepper, decode.StaticStepper) and stepper.forward.lean is not None
    lean_llama.set_enabled(resident.model, False)
    try:
        off = decode.decode_path(resident.model, resident.device, resident.weights)
        assert off.forward == "transformers" and "turned off" in off.lean_refused
    finally:
        lean_llama.set_enabled(resident.model, True)
    config = resident.model.config
    config.sliding_window, config.use_sliding_window = 16, True
    try:
        dynamic = decode.decode_path(resident.model, resident.device, resident.weights)
        assert (dynamic.stepper, dynamic.forward) == ("dynamic", "transformers") and "dynamic" in dynamic.lean_refused
    finally:
        config.sliding_window = None


def test_the_engine_reports_each_resident_decode_path(engine):
    engine.resident("tiny")
    (base,) = engine.ps()["bases"]
    assert base["decode"]["stepper"] == "static" and base["decode"]["forward"] == "lean"


# -- the cache object itself ------------------------------------------------------------------------

LOW = torch.finfo(torch.float32).min


def visible(mask_row):
    return (mask_row.flatten() == 0).nonzero().flatten().tolist()


def test_static_cache_rows_keep_their_own_lengths_and_masks():
    cache = StaticKVCache(layers=2, kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))
    cache.reserve(batch=2, length=5)
    cache.begin(2)
    assert cache.capacity == static_cache.CAPACITY_STEP and cache.lengths == [0, 0]
    chunk, mask = cache.chunk(0, 3)                        # row 0's prompt, alone: causal from its start
    assert mask.shape == (1, 1, 3, 3) and mask[0, 0, 0].tolist() == [0.0, LOW, LOW]
    k = torch.arange(6, dtype=torch.float32).view(1, 1, 3, 2)
    keys, _ = chunk.update(k, -k, 0)
    assert keys.shape == (1, 1, 3, 2) and torch.equal(keys, k)
    cache.advance_row(0, 3)
    chunk, mask = cache.chunk(0, 2)                        # its next chunk sees the first one
    assert mask.shape == (1, 1, 2, 5) and mask[0, 0, 0].tolist() == [0.0, 0.0, 0.0, 0.0, LOW]
    cache.advance_row(0, 2)
    chunk, _ = cache.chunk(1, 1)
    cache.advance_row(1, 1)
    assert cache.lengths == [5, 1] and visible(cache.mask[1]) == [0]
    assert torch.equal(cache.keys[0][1, 0, 0], torch.zeros(2))    # row 1 never saw row 0's keys

    view = cache.step_view()                               # each row writes at its own next column
    assert view.positions.tolist() == [5, 1] and view.host_lengths == [6, 2]
    assert view.mask.shape == (2, 1, 1, 6)
    assert visible(view.mask[0]) == [0, 1, 2, 3, 4, 5] and visible(view.mask[1]) == [0, 1]
    new = torch.full((2, 1, 1, 2), 7.0)
    keys, _ = cache.update(new, new, 1)
    assert keys.shape == (2, 1, 6, 2) and keys[0, 0, 5].tolist() == [7.0, 7.0] and keys[1, 0, 1].tolist() == [7.0, 7.0]
    cache.end_step([True, False])                          # row 1 was not live: it did not advance
    assert cache.lengths == [6, 1]
    cache.reset_row(0)
    assert cache.lengths == [0, 1] and visible(cache.mask[0]) == []


def test_static_cache_growth_keeps_every_rows_history():
    cache = StaticKVCache(layers=1, kv_heads=1, head_dim=1, dtype=torch.float32, device=torch.device("cpu"))
    cache.reserve(1, 2)
    cache.begin(1)
    chunk, _ = cache.chunk(0, 2)
    chunk.update(torch.tensor([[[[1.0], [2.0]]]]), torch.tensor([[[[3.0], [4.0]]]]), 0)
    cache.advance_row(0, 2)
    before = cache.capacity
    cache.reserve(2, before + 1)
    cache.resize(2)
    assert cache.capacity == 2 * before and cache.allocations == 2 and cache.lengths == [2, 0]
    assert cache.keys[0][0, 0, :2, 0].tolist() == [1.0, 2.0]
    assert cache.values[0][0, 0, :2, 0].tolist() == [3.0, 4.0]
    assert visible(cache.mask[0]) == [0, 1] and visible(cache.mask[1]) == []


def test_full_view_cache_moves_lengths_on_the_device():
    cache = StaticKVCache(layers=1, kv_heads=1, head_dim=1, dtype=torch.float32, device=torch.device("cpu"),
                          full_views=True)
    cache.reserve(2, 3)
    cache.begin(2)
    for row, width in ((0, 2), (1, 1)):
        chunk, _ = cache.chunk(row, width)
        chunk.update(torch.ones(1, 1, width, 1), torch.ones(1, 1, width, 1), 0)
        cache.advance_row(row, width)
    assert cache.written.tolist() == [2, 1]
    view = cache.step_view()
    assert view.host_lengths is None and view.positions.tolist() == [2, 1]
    assert view.mask.shape == (2, 1, 1, cache.capacity)
    assert visible(view.mask[0]) == [0, 1, 2] and visible(view.mask[1]) == [0, 1]
    keys, _ = cache.update(torch.full((2, 1, 1, 1), 5.0), torch.zeros(2, 1, 1, 1), 0)
    assert keys.shape == (2, 1, cache.capacity, 1) and keys[0, 0, 2, 0].item() == 5.0 and keys[1, 0, 1, 0].item() == 5.0
    cache.advance_on_device(torch.tensor([1, 0]))
    cache.end_step([True, False])
    assert cache.written.tolist() == [3, 1] and cache.lengths == [3, 1]
