"""How many threads torch may use: decided in one place for the CLI, the daemon and the benchmarks.

Why this exists: torch splits each CPU op across its intra-op pool and waits at a barrier for
every thread. When another process holds a core (a browser, a build, an indexer), each op waits
for the thread that shares that core, so a 2-thread pool on a 2-core machine with one core busy
made a merging import 2-3x slower than one thread (BENCHMARKS.md, "Threads on a busy machine").

The policy, "auto" (the default): every forward (prompt prefill, a decode step, the quality
gate's scoring batches, embeddings) gets one thread per core that is free: the usable cores
(physical cores, CPU affinity, a cgroup quota, OMP_NUM_THREADS if set), less the cores' worth of
CPU time other processes took lately, less other threads of this process running forwards now. A
core counts as free while others take under FREE_MARGIN of it. The load is re-read at most every
REFRESH seconds, so a core that becomes busy costs at most that long at the wrong count.
The count goes to torch (`torch.set_num_threads`) and to zenedge's C kernels (kernels/native/,
`set_threads`), which split a product's output rows over it. A decode step on the C kernels
gives torch 1 thread: its few torch ops are too small to split, and the C kernels take chunks as
threads come free (pool.c), so a core that turns busy mid-step holds up at most a chunk.
`runtime.threads = N` in the config, or ZENEDGE_THREADS=N, sets N threads for everything instead.

Work made of independent pieces (the gate's scoring batches, embedding batches) runs on lanes
instead (`map_lanes`): one persistent thread per usable core, each with one torch thread, taking
the next piece when it is done with the last. No barrier joins them, so a lane on a busy core only
takes fewer pieces: measured, 4 scoring batches took 1.99 s on two lanes, 2.59 s with torch's two
threads and 3.87 s with one on a quiet machine; 3.12 s, 11.5 s and 3.80 s with one core busy.

Every forward on a resident starts in `VariantState.applied` (runtime/layers.py), which calls
`pace()`: the count is set there, in the thread that runs the forward (torch's count is per
thread under OpenMP), and only when it changes.

The OpenMP workers themselves are told to sleep soon after a parallel region instead of spinning
for long (`prepare_environment`, before torch starts its pool): a spinning worker takes a core
from whatever else runs, ours included.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

FREE_MARGIN = 0.2     # a core counts as free while other work takes less than this share of it
REFRESH = 0.25        # seconds between readings of the load: ≥ 25 scheduler ticks per core
RECENT = 0.25         # seconds a thread of ours counts as running forwards after its last one
# libgomp (Linux torch) spins this many rounds (well under a millisecond here) before an idle
# worker sleeps (default 300000, 10x longer); LLVM's libomp (macOS) sleeps after KMP_BLOCKTIME ms
# (default 200). On a quiet machine the three ways to wait score the gate's batches equally fast
# (BENCHMARKS.md); a bounded spin keeps a quick hand-off between the regions of one op, and sleeps
# soon, so a busy core elsewhere does not stall the workers waiting for it.
OPENMP_ENVIRONMENT = {"GOMP_SPINCOUNT": "30000", "KMP_BLOCKTIME": "1"}


def prepare_environment(environ: dict = os.environ) -> None:
    """Bound the OpenMP workers' spin before torch loads its OpenMP runtime (which reads these
    once, when it starts): the CLI's entry point calls this first. A value the user set wins."""
    if any(key in environ for key in ("OMP_WAIT_POLICY", *OPENMP_ENVIRONMENT)):
        return   # the user tuned OpenMP's waiting: leave all of it to them
    environ.update(OPENMP_ENVIRONMENT)


@dataclass(frozen=True)
class Decision:
    threads: int
    why: str


def choose(cores: int, other_load: float, other_lanes: int, *, setting: int | None = None,
           source: str = "", single_step: bool = False) -> Decision:
    """The thread count for one piece of work (pure: the unit tests call it with made-up loads).

    cores: usable cores; other_load: cores' worth of CPU other processes used lately;
    other_lanes: other threads of this process running forwards now; setting: a fixed count
    (from `source`) or None for "auto"; single_step: a decode step on the C kernels (the count is
    the C kernels'; torch gets 1)."""
    if setting is not None:
        return Decision(setting, f"{source} = {setting}")
    free = cores - other_load - other_lanes
    threads = max(1, min(cores, math.floor(free + FREE_MARGIN)))
    busy = []
    if other_load >= FREE_MARGIN:
        busy.append(f"{other_load:.1f} cores' worth busy with other processes")
    if other_lanes:
        busy.append(f"{other_lanes} running other work of this process")
    why = f"{threads} of {cores} cores" + (f": {', '.join(busy)}" if busy else " free")
    return Decision(threads, why + (", for the C kernels (torch 1)" if single_step else ""))


def usable_cores(cap: int | None = None) -> tuple[int, str]:
    """Cores torch's pool may use here, and what limited them: physical cores (hyperthreads
    share a core's units: torch's own default), the CPU affinity mask, a cgroup CPU quota,
    OMP_NUM_THREADS (`cap`)."""
    import psutil

    limits = {"physical cores": psutil.cpu_count(logical=False) or os.cpu_count() or 1}
    if hasattr(os, "sched_getaffinity"):
        limits["CPU affinity"] = len(os.sched_getaffinity(0))
    quota = _cgroup_quota()
    if quota is not None:
        limits["cgroup CPU quota"] = quota
    if cap is not None:
        limits["OMP_NUM_THREADS"] = cap
    reason = min(limits, key=limits.get)
    return max(1, limits[reason]), reason


def _cgroup_quota() -> int | None:
    """A cgroup v2 CPU quota in whole cores (rounded up), where one is set (containers)."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))


class LoadMeter:
    """Cores' worth of CPU time other processes used since the last reading: the whole system's
    busy time less this process's own (our threads are counted as lanes instead)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        import psutil

        self._psutil = psutil
        self._process = psutil.Process()
        self._clock = clock
        self._last = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        system = self._psutil.cpu_times()
        busy = sum(getattr(system, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq", "steal"))
        own = self._process.cpu_times()
        return self._clock(), busy, own.user + own.system

    def age(self) -> float:
        """Seconds since the last reading."""
        return self._clock() - self._last[0]

    def read(self) -> float:
        now = self._sample()
        (then, busy0, own0), (t, busy, own) = self._last, now
        self._last = now
        if t - then <= 0:
            return 0.0
        return max(0.0, (busy - busy0 - (own - own0)) / (t - then))


class Policy:
    """The process's thread policy: a fixed count, or "auto" re-decided from the load."""

    def __init__(self, setting: int | None, source: str, *, cap: int | None = None,
                 meter: LoadMeter | None = None, clock: Callable[[], float] = time.monotonic):
        self.setting, self.source, self.cap = setting, source, cap
        self.cores, self.limited_by = usable_cores(cap)
        self._clock = clock
        self._meter = meter if meter is not None or setting is not None else LoadMeter(clock)
        self._lock = threading.Lock()
        self._running: dict[int, float] = {}     # thread id → when its last forward ended (0: running now)
        self._load = 0.0                         # other processes' cores' worth, as last read
        self._read_at = -math.inf
        self._local = threading.local()
        self._pool = None                        # the lanes' threads, made on first use
        self._pool_size = 0

    def _other_lanes(self, me: int, now: float) -> int:
        return sum(1 for thread, ended in self._running.items()
                   if thread != me and (ended == 0 or now - ended < RECENT))

    def wide(self, single_step: bool = False) -> Decision:
        """The count for a forward now, in this thread (the other processes' load is re-read at
        most every REFRESH seconds; this process's other running forwards are counted at every
        call); single_step: a decode step on the C kernels (`choose`)."""
        now = self._clock()
        with self._lock:
            if self.setting is None and now - self._read_at >= REFRESH:
                self._load, self._read_at = self._meter.read(), now
            lanes = self._other_lanes(threading.get_ident(), now)
        return choose(self.cores, self._load, lanes, setting=self.setting, source=self.source, single_step=single_step)

    def decide(self, single_step: bool) -> Decision:
        if getattr(self._local, "lane", False):
            return Decision(1, "one of the lanes that share this work")
        return self.wide(single_step)

    def begin(self, single_step: bool) -> None:
        """A forward starts in this thread: set torch's and the C kernels' counts for it (`pace`). Forwards nest (the
        gate's prefix states inside its batch): the outermost one counts."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth:
            return
        with self._lock:
            self._running[threading.get_ident()] = 0.0
        threads = self.decide(single_step).threads
        torch_threads = 1 if single_step and self.setting is None else threads
        if getattr(self._local, "threads", None) != (threads, torch_threads):
            import torch

            from zenedge.kernels import native

            torch.set_num_threads(torch_threads)   # this thread's OpenMP count (and MKL's)
            native.set_threads(threads)            # the C kernels' count in this thread
            self._local.threads = (threads, torch_threads)

    def end(self) -> None:
        self._local.depth -= 1
        if self._local.depth:
            return
        with self._lock:
            self._running[threading.get_ident()] = self._clock()
            if len(self._running) > 64:         # threads come and go in a long-lived daemon
                now = self._clock()
                self._running = {t: e for t, e in self._running.items() if e == 0 or now - e < RECENT}

    def lanes(self) -> int:
        """How many lanes a piece of independent work may spread over now: every usable core not
        running other work of this process (other processes' load is shared, not waited on);
        1 with a fixed count of 1."""
        if self.setting is not None:
            return self.setting
        with self._lock:
            others = self._other_lanes(threading.get_ident(), self._clock())
        return max(1, self.cores - others)

    def map(self, work: Callable[[T], R], pieces: Sequence[T]) -> list[R]:
        """`[work(p) for p in pieces]`, the pieces spread over `lanes()` lanes (in order)."""
        lanes = min(self.lanes(), len(pieces))
        if lanes <= 1:
            return [work(piece) for piece in pieces]
        with self._lock:
            if self._pool is None or self._pool_size < lanes:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(lanes, thread_name_prefix="zenedge-lane")
                self._pool_size = lanes
            pool = self._pool
        queue = iter(enumerate(pieces))
        results: list = [None] * len(pieces)
        taking = threading.Lock()

        def lane() -> None:
            self._local.lane = True          # forwards in this thread take one torch thread
            try:
                while True:
                    with taking:
                        item = next(queue, None)
                    if item is None:
                        return
                    results[item[0]] = work(item[1])
            finally:
                self._local.lane = False

        for future in [pool.submit(lane) for _ in range(lanes)]:
            future.result()                  # re-raises a lane's exception here
        return results

    def report(self, single_step: bool | None = None) -> dict:
        """What `doctor` and /api/ps show: the setting, the cores, and the counts in use now (a
        process that never read the load reads it over REFRESH seconds first: `doctor`)."""
        if self._meter is not None and self._read_at == -math.inf:
            time.sleep(max(0.0, REFRESH - self._meter.age()))
        wide = self.wide()
        out = {"setting": "auto" if self.setting is None else self.setting, "source": self.source,
               "cores": self.cores, "cores_limited_by": self.limited_by,
               "wide": wide.threads, "wide_why": wide.why}
        if single_step is not None:
            step = self.decide(single_step)
            out.update(decode=step.threads, decode_why=step.why)
        return out


_policy: list[Policy] = []
_policy_lock = threading.Lock()


def configure(setting: int | str = "auto") -> Policy:
    """Install the process's policy from the config's runtime.threads; ZENEDGE_THREADS wins.
    Called by the Engine (the config in force); a policy is made with the defaults otherwise."""
    from zenedge import paths

    override = paths.threads_from_env()
    if override is not None:
        setting, source = override, "ZENEDGE_THREADS"
    else:
        source = "runtime.threads"
    count = None if setting == "auto" else int(setting)
    cap = paths.omp_threads_from_env()
    with _policy_lock:
        current = _policy[0] if _policy else None
        if current is None or (current.setting, current.source, current.cap) != (count, source, cap):
            _policy[:] = [Policy(count, source, cap=cap)]
        return _policy[0]


def map_lanes(work: Callable[[T], R], pieces: Sequence[T]) -> list[R]:
    """`[work(p) for p in pieces]` for independent pieces of wide work, spread over lanes (Policy.map)."""
    return policy().map(work, pieces)


def policy() -> Policy:
    """The process's policy (the defaults and the environment until `configure` is called)."""
    if not _policy:
        configure()
    return _policy[0]


class pace:
    """`with pace(single_step):` around a forward: torch's count set for this thread, and the
    thread counted as busy while it runs (other threads' wide work leaves it its core)."""

    __slots__ = ("_policy", "_single")

    def __init__(self, single_step: bool = False):
        self._policy = policy()
        self._single = single_step

    def __enter__(self) -> None:
        self._policy.begin(self._single)

    def __exit__(self, *exc) -> None:
        self._policy.end()
