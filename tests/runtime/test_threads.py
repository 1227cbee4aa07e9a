"""The thread policy (runtime/threads.py): the choice for given cores and loads, the overrides, and
that forwards and lanes get the counts it decides."""

from __future__ import annotations

import threading

import pytest
import torch

from zenedge import config
from zenedge.errors import ConfigError, InvalidInput
from zenedge.runtime import threads
from zenedge.runtime.threads import Policy, choose


@pytest.fixture(autouse=True)
def fresh_policy():
    """Each test installs its own process policy; the suite's goes back afterwards."""
    saved = list(threads._policy)
    yield
    threads._policy[:] = saved


class FakeMeter:
    def __init__(self, load: float = 0.0):
        self.load = load

    def read(self) -> float:
        return self.load

    def age(self) -> float:
        return threads.REFRESH


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("cores, load, lanes, expected", [
    (2, 0.0, 0, 2),      # quiet: every core
    (2, 0.15, 0, 2),     # a little noise on a core still leaves it free
    (2, 1.0, 0, 1),      # one core busy elsewhere: never wait on it
    (2, 0.5, 0, 1),      # half a core busy is still a core we would wait on
    (2, 2.0, 0, 1),      # everything busy: one thread, never zero
    (8, 2.7, 0, 5),
    (8, 0.0, 3, 5),      # three threads of ours run forwards: leave them their cores
    (8, 1.0, 2, 5),
    (1, 0.0, 0, 1),
])
def test_auto_takes_the_cores_other_work_leaves_free(cores, load, lanes, expected):
    decision = choose(cores, load, lanes)
    assert decision.threads == expected
    assert f"{expected} of {cores} cores" in decision.why


def test_decode_steps_on_the_c_kernels_take_the_free_cores_and_a_fixed_count_wins():
    assert choose(16, 0.0, 0, single_step=True).threads == 16
    busy = choose(2, 1.0, 0, single_step=True)       # a core held by another process: one thread
    assert busy.threads == 1 and "for the C kernels (torch 1)" in busy.why
    fixed = choose(16, 5.0, 3, setting=6, source="ZENEDGE_THREADS", single_step=True)
    assert (fixed.threads, fixed.why) == (6, "ZENEDGE_THREADS = 6")


def test_the_policy_follows_the_load_at_most_every_refresh():
    meter, clock = FakeMeter(0.0), Clock()
    policy = Policy(None, "runtime.threads", meter=meter, clock=clock)
    policy.cores = 2
    assert policy.wide().threads == 2
    meter.load = 1.0
    assert policy.wide().threads == 2            # within REFRESH: the last decision stands
    clock.now += threads.REFRESH
    assert policy.wide().threads == 1
    assert "busy with other processes" in policy.wide().why


def test_another_thread_running_forwards_counts_as_a_busy_core():
    clock = Clock()
    policy = Policy(None, "runtime.threads", meter=FakeMeter(), clock=clock)
    policy.cores = 2
    entered, leave = threading.Event(), threading.Event()

    def forward():
        policy.begin(single_step=True)
        entered.set()
        leave.wait(10)
        policy.end()

    worker = threading.Thread(target=forward)
    worker.start()
    entered.wait(10)
    assert policy.wide().threads == 1 and policy.lanes() == 1
    leave.set()
    worker.join()
    clock.now += threads.RECENT + threads.REFRESH  # it stopped a while ago
    assert policy.wide().threads == 2 and policy.lanes() == 2


def test_a_forward_sets_torch_threads_in_its_own_thread_only():
    clock = Clock()
    policy = Policy(None, "runtime.threads", meter=FakeMeter(), clock=clock)
    policy.cores = 2
    threads._policy[:] = [policy]
    seen = {}

    def decode_step():
        with threads.pace(single_step=True):
            seen["step"] = torch.get_num_threads()

    worker = threading.Thread(target=decode_step)
    worker.start()
    worker.join()
    clock.now += threads.RECENT                      # the decode thread is idle by now
    with threads.pace(single_step=False):
        seen["prefill"] = torch.get_num_threads()
        with threads.pace(single_step=True):       # nested: the outer forward's count holds
            seen["nested"] = torch.get_num_threads()
    assert seen == {"step": 1, "prefill": 2, "nested": 2}


def test_lanes_keep_order_spread_over_threads_and_run_one_torch_thread_each():
    policy = Policy(2, "test", clock=Clock())
    threads._policy[:] = [policy]
    barrier = threading.Barrier(2, timeout=10)   # passes only if two lanes run at once

    def work(piece: int):
        if piece < 2:
            barrier.wait()
        with threads.pace():
            return piece * 10, torch.get_num_threads(), threading.current_thread().name

    results = threads.map_lanes(work, list(range(6)))
    assert [r[0] for r in results] == [0, 10, 20, 30, 40, 50]
    assert {r[1] for r in results} == {1}
    assert len({r[2] for r in results}) == 2 and all(r[2].startswith("zenedge-lane") for r in results)


def test_a_lane_error_reaches_the_caller():
    threads._policy[:] = [Policy(2, "test", clock=Clock())]

    def work(piece: int):
        if piece == 3:
            raise ValueError("piece 3")
        return piece

    with pytest.raises(ValueError, match="piece 3"):
        threads.map_lanes(work, list(range(5)))


def test_one_thread_means_no_lanes():
    threads._policy[:] = [Policy(1, "test", clock=Clock())]
    names = threads.map_lanes(lambda _: threading.current_thread().name, [1, 2, 3])
    assert set(names) == {threading.current_thread().name}


def test_the_environment_overrides_the_config(monkeypatch):
    monkeypatch.setenv("ZENEDGE_THREADS", "3")
    policy = threads.configure("auto")
    assert (policy.setting, policy.source) == (3, "ZENEDGE_THREADS")
    assert policy.report()["wide"] == 3
    monkeypatch.setenv("ZENEDGE_THREADS", "auto")
    assert threads.configure(5).setting is None
    monkeypatch.delenv("ZENEDGE_THREADS")
    assert (threads.configure(5).setting, threads.policy().source) == (5, "runtime.threads")


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "2000"])
def test_a_bad_environment_value_is_one_clear_error(monkeypatch, value):
    monkeypatch.setenv("ZENEDGE_THREADS", value)
    with pytest.raises(InvalidInput, match="ZENEDGE_THREADS"):
        threads.configure()


def test_the_config_key_takes_auto_or_a_count(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[runtime]\nthreads = 4\n")
    assert config.load(path).runtime.threads == 4
    assert config.load(tmp_path / "absent.toml").runtime.threads == "auto"
    path.write_text('[runtime]\nthreads = "many"\n')
    with pytest.raises(ConfigError, match="runtime.threads"):
        config.load(path)


def test_omp_num_threads_caps_the_usable_cores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    policy = threads.configure("auto")
    assert (policy.cores, policy.limited_by) == (1, "OMP_NUM_THREADS")


def test_openmp_waiting_is_bounded_unless_the_user_tuned_it():
    environ: dict = {}
    threads.prepare_environment(environ)
    assert environ == threads.OPENMP_ENVIRONMENT
    mine = {"OMP_WAIT_POLICY": "active"}
    threads.prepare_environment(mine)
    assert mine == {"OMP_WAIT_POLICY": "active"}


@pytest.mark.parametrize("weights", ["int4", "full"])
def test_generation_prefills_wide_and_decodes_on_one_thread_where_the_c_kernels_run(tiny_base_dir, weights):
    from zenedge.kernels import native
    from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
    from zenedge.runtime.model import load_resident

    policy = Policy(None, "runtime.threads", meter=FakeMeter(), clock=Clock())
    policy.cores = 2
    threads._policy[:] = [policy]
    resident = load_resident("tiny", tiny_base_dir, torch.device("cpu"), torch.float32, weights=weights)
    native_steps = weights == "int4" and native.int4_gemm() is not None
    assert resident.state.native_steps == native_steps
    counts = []
    hook = resident.model.model.norm.register_forward_pre_hook(lambda *_: counts.append(torch.get_num_threads()))
    try:
        for _ in generate(resident, [GenerationRequest([5, 6, 7], None, SamplingParams(max_tokens=4))]):
            pass
    finally:
        hook.remove()
    assert counts[0] == 2                                  # the prompt's prefill: both free cores
    assert set(counts[1:]) == {1 if native_steps else 2}   # decode steps
