"""The scheduler on its own: batching by base, max batch, bounded queue, cancellation, a long
prompt's prefill shared with other jobs' decoding, jobs joining a running batch, prompts past the
context refused per job (deterministic: jobs are queued before the worker starts, or the worker
waits for the test at a known point; event order is counted, never timed)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.server.harness import make_home, one_torch_thread
from zenedge import bases, config
from zenedge.errors import ContextLengthExceeded
from zenedge.runtime import decode, generate as generate_module
from zenedge.runtime.engine import Engine, Prompt
from zenedge.runtime.generate import SamplingParams
from zenedge.server.errors import QueueFull, ShuttingDown
from zenedge.server.scheduler import Scheduler
from zenedge.store import Store

PARAMS = SamplingParams(max_tokens=10)


@pytest.fixture
def engine(tmp_path, tiny_base_dir):
    home, config_path = make_home(tmp_path, tiny_base_dir)
    store = Store(home)
    bases.add_hf_dir(store, tiny_base_dir, "tiny2")  # a second base: its jobs never share a batch with tiny's
    with one_torch_thread():
        yield Engine(store, config.load(config_path))


def prompt(i: int) -> Prompt:
    return Prompt(messages=[{"role": "user", "content": f"request number {i}" + "!" * i}])


async def run_job(job) -> tuple[str, str]:
    kind, _ = await job.events.get()
    assert kind == "start"
    text = ""
    while True:
        kind, delta = await job.events.get()
        assert kind == "delta", delta
        text += delta.text
        if delta.finish_reason:
            return text, delta.finish_reason


def test_waiting_jobs_of_one_base_run_as_one_mixed_batch(engine):
    names = ["p0", "p1", "tiny2", "p2", "p3", "tiny", "p0", "tiny2"]
    scheduler = Scheduler(engine, max_queue=16, max_batch=4)

    async def main():
        jobs = [scheduler.submit(engine.router.route(n), prompt(i), PARAMS) for i, n in enumerate(names)]
        scheduler.start()
        return await asyncio.gather(*(run_job(j) for j in jobs))

    try:
        results = asyncio.run(main())
    finally:
        scheduler.stop()
    # [p0 p1 p2 p3] (tiny, capped at 4) → [tiny2 tiny2] → [tiny p0]
    assert (scheduler.counters.batches, scheduler.counters.largest_batch) == (3, 4)
    assert scheduler.counters.completed == len(names)
    for i, (name, (text, reason)) in enumerate(zip(names, results)):
        alone = engine.complete(name, prompt(i), PARAMS)
        assert (text, reason) == (alone.text, alone.finish_reason), name


def test_queue_is_bounded_and_cancelled_jobs_leave_it(engine):
    scheduler = Scheduler(engine, max_queue=2)
    route = engine.router.route("p0")

    async def main():
        first = scheduler.submit(route, prompt(0), PARAMS)
        scheduler.submit(route, prompt(1), PARAMS)
        with pytest.raises(QueueFull):
            scheduler.submit(route, prompt(2), PARAMS)
        first.cancel()  # its client went away while it waited
        third = scheduler.submit(route, prompt(3), PARAMS)
        assert scheduler.stats()["queued"] == 2
        scheduler.start()
        return await run_job(third)

    try:
        text, _ = asyncio.run(main())
    finally:
        scheduler.stop()
    assert text == engine.complete("p0", prompt(3), PARAMS).text
    assert scheduler.counters.rejected == 1 and scheduler.counters.cancelled == 1
    assert scheduler.counters.completed == 2


def test_a_running_job_is_cancelled_at_the_next_step(engine):
    scheduler = Scheduler(engine, max_queue=4)

    async def main():
        job = scheduler.submit(engine.router.route("forever"), prompt(0), SamplingParams(max_tokens=65536))
        scheduler.start()
        assert (await job.events.get())[0] == "start"
        await job.events.get()
        job.cancel()
        while True:
            _, delta = await job.events.get()
            if delta.finish_reason:
                return delta.finish_reason

    try:
        assert asyncio.run(main()) == "cancelled"
    finally:
        scheduler.stop()
    assert scheduler.counters.cancelled == 1


def test_stopping_fails_waiting_jobs_and_refuses_new_ones(engine):
    scheduler = Scheduler(engine, max_queue=4)

    async def main():
        job = scheduler.submit(engine.router.route("p0"), prompt(0), PARAMS)
        scheduler.stop()
        await asyncio.sleep(0)
        kind, error = await job.events.get()
        assert kind == "error" and isinstance(error, ShuttingDown)
        with pytest.raises(ShuttingDown):
            scheduler.submit(engine.router.route("p0"), prompt(1), PARAMS)

    asyncio.run(main())


LONG = Prompt(text="a long prompt, " * 6)          # ~90 tokens: a dozen chunks of 8


def recorded(scheduler) -> list:
    """(job, kind) of every event the worker delivers, in order."""
    order, deliver = [], scheduler._deliver

    def spy(items, finishing=False):
        order.extend((job, event[0]) for job, event in items)
        deliver(items, finishing)
    scheduler._deliver = spy
    return order


def deltas_before_first_of(order, long_job, other) -> int:
    first = next(n for n, (job, kind) in enumerate(order) if job is long_job and kind == "delta")
    return sum(job is other and kind == "delta" for job, kind in order[:first])


def test_a_short_job_gets_tokens_while_a_long_prompt_prefills(engine, monkeypatch):
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", 8)
    scheduler = Scheduler(engine, max_queue=4)
    order = recorded(scheduler)

    async def main():
        long = scheduler.submit(engine.router.route("p0"), LONG, PARAMS)
        short = scheduler.submit(engine.router.route("p1"), prompt(1), SamplingParams(max_tokens=40))
        scheduler.start()
        results = await asyncio.gather(run_job(long), run_job(short))
        return long, short, results

    try:
        long, short, results = asyncio.run(main())
    finally:
        scheduler.stop()
    assert scheduler.counters.batches == 1
    assert deltas_before_first_of(order, long, short) >= 8
    alone = engine.complete("p1", prompt(1), SamplingParams(max_tokens=40))
    assert results[1] == (alone.text, alone.finish_reason)


def test_a_job_that_arrives_mid_batch_joins_it(engine, monkeypatch):
    """While a long prompt prefills, a new job on the same base starts at the next tick instead of
    waiting for the batch to end. The worker holds at the long prompt's second chunk until the
    test has submitted the new job."""
    monkeypatch.setattr(generate_module, "PREFILL_CHUNK", 8)
    submitted, prefill = threading.Event(), decode.StaticStepper.prefill
    calls = []

    def held_prefill(stepper, row, input_ids):
        calls.append(row)
        if len(calls) == 2:
            assert submitted.wait(60), "the test never submitted the second job"
        return prefill(stepper, row, input_ids)

    monkeypatch.setattr(decode.StaticStepper, "prefill", held_prefill)
    scheduler = Scheduler(engine, max_queue=4)
    order = recorded(scheduler)

    async def main():
        long = scheduler.submit(engine.router.route("p0"), LONG, PARAMS)
        scheduler.start()
        assert (await long.events.get())[0] == "start"
        short = scheduler.submit(engine.router.route("p2"), prompt(2), PARAMS)
        submitted.set()
        text, reason = await run_job(short)
        while not long.done:
            await long.events.get()
        return long, short, text, reason

    try:
        long, short, text, reason = asyncio.run(main())
    finally:
        scheduler.stop()
    assert scheduler.counters.batches == 1 and scheduler.counters.largest_batch == 2   # it joined
    assert deltas_before_first_of(order, long, short) >= 1
    alone = engine.complete("p2", prompt(2), PARAMS)
    assert (text, reason) == (alone.text, alone.finish_reason)


def test_a_prompt_past_the_context_fails_its_job_and_not_its_batch(engine):
    scheduler = Scheduler(engine, max_queue=4)

    async def main():
        too_long = scheduler.submit(engine.router.route("p0"), Prompt(text="x" * 500), PARAMS)
        fine = scheduler.submit(engine.router.route("p1"), prompt(1), PARAMS)
        scheduler.start()
        kind, error = await too_long.events.get()
        return kind, error, await run_job(fine)

    try:
        kind, error, result = asyncio.run(main())
    finally:
        scheduler.stop()
    assert kind == "error" and isinstance(error, ContextLengthExceeded) and "500 tokens" in str(error)
    alone = engine.complete("p1", prompt(1), PARAMS)
    assert result == (alone.text, alone.finish_reason)
    assert scheduler.counters.failed == 1 and scheduler.counters.completed == 1
