"""The scheduler on its own: batching by base, max batch, bounded queue, cancellation (deterministic:
jobs are queued before the worker starts)."""

from __future__ import annotations

import asyncio

import pytest

from tests.server.harness import make_home, one_torch_thread
from zenedge import bases, config
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
        job = scheduler.submit(engine.router.route("p1"), prompt(0), SamplingParams(max_tokens=65536))
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
