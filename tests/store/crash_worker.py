"""Kill a pool writer at a random instant and check that nothing was lost.

The worker (`python -m tests.store.crash_worker HOME VARIANTS SEED OPS`) changes the pool in a
loop: imports, removals, budget changes, gc, and optionally pulls (from the registry in its
config), maintenance, merges and compression (a budget just under use). It prints `op <name>` before each operation, so the killer knows
what it interrupted. Used by tests/store/test_crash_safety.py and the fault script (tests/faults.py).

After each kill, `kill_and_check` asserts what "nothing lost" means:
- before any repair, the only problems are leftovers that start-up removes (orphan blobs, staging);
- after start-up's reconcile, `check()` finds nothing (every blob re-hashed; with `deep`, the bases too), the budget holds;
- every profile there before the kill is still there, unless a committed event (rm, evict) removed it.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

LIGHT_OPS = ("import", "rm", "budget", "gc")
HEAVY_OPS = ("pull", "maintain", "merge", "compress")  # load torch first (the quality gate), pull needs a registry
WEIGHTS = {"import": 5, "rm": 2, "budget": 2, "gc": 1, "pull": 4, "maintain": 2, "merge": 2, "compress": 2}
NAMES = ["a", "b", "c", "d"]
ALLOWED_BEFORE_RECONCILE = ("orphan blob", "leftover temporary file")


def worker(home: Path, variants: list[str], seed: int, ops: list[str]) -> None:
    from zenedge import config, pool
    from zenedge.errors import ZenedgeError
    from zenedge.store import Store

    rng = random.Random(seed)
    store = Store(home)
    if set(ops) & set(HEAVY_OPS):
        from zenedge.pool import maintain, merger  # noqa: F401  (torch and the gate loaded before "ready")
        from zenedge.pool import pull  # noqa: F401
    print("ready", flush=True)
    weights = [WEIGHTS[op] for op in ops]
    while True:
        cfg = config.load()
        op = rng.choices(ops, weights)[0]
        print(f"op {op}", flush=True)
        try:
            if op == "import":
                pool.import_lora(store, cfg, Path(rng.choice(variants)), rng.choice(NAMES), base="tiny")
            elif op == "rm":
                store.remove_name(rng.choice(NAMES + ["writer", "coder"]))
            elif op == "budget":
                pool.set_budget(store, cfg, f"{int(math.exp(rng.uniform(math.log(20_000), math.log(400_000))))}B")
            elif op == "gc":
                store.reconcile()
            elif op == "pull":
                from zenedge.pool.pull import pull

                pull(store, cfg, rng.choice(["writer", "coder", "writer-copy"]))
            elif op == "maintain":
                from zenedge.pool.maintain import maintain

                maintain(store, cfg, verify=rng.random() < 0.5)
            elif op == "compress":
                # A budget just under what the pool uses: adapters are stored smaller first (each
                # through the gate: a kill lands in the quantization, the gate or the commit), then evicted.
                pool.set_budget(store, cfg, f"{max(20_000, int(store.used_bytes() * 0.9))}B")
            elif op == "merge":
                from zenedge.pool import manual_merge

                present = [n["name"] for n in store.names()]
                if len(present) >= 2:
                    manual_merge(store, cfg, rng.sample(present, 2), "opcm", force=rng.random() < 0.5)
        except ZenedgeError:
            pass


@dataclass
class Kill:
    op: str             # what the worker was doing when it died
    killed: bool
    lost: list[str]     # profiles gone without a committed removal
    problems: list[str]  # broken invariants: before reconcile (beyond leftovers) or after it


def spawn(home: Path, variants: list[str], seed: int, ops: list[str], env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "tests.store.crash_worker", str(home), ",".join(variants),
                             str(seed), ",".join(ops)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, text=True)
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        raise AssertionError(f"worker did not start: {line} {proc.stderr.read()}")
    return proc


def snapshot(home: Path) -> tuple[set[str], float]:
    from zenedge.store import Store

    store = Store(home, reconcile=False)
    names = {row["name"] for row in store.names()}
    store.close()
    return names, time.time()


def removed_since(store, since: float) -> set[str]:
    """Names a committed rm/evict event removed after `since`."""
    removed = set()
    for event in store.events(10_000):
        if event["at"] >= since and event["kind"] in ("rm", "evict") and event["name"]:
            removed |= set(event["name"].split(","))
    return removed


def kill_and_check(home: Path, variants: list[str], seed: int, delay: float, ops: list[str],
                   budget_of, env: dict | None = None, deep: bool = True, target: str | None = None) -> Kill:
    """Start a worker, SIGKILL it `delay` seconds after it is ready (or after it starts a `target`
    operation), and check the pool as the module says. `budget_of()`: the configured budget now
    (the worker may have changed it)."""
    from zenedge.bases import check_bases
    from zenedge.store import Store

    before, since = snapshot(home)
    proc = spawn(home, variants, seed, ops, env)
    seen = []
    if target is not None:
        while (line := proc.stdout.readline()) and line.strip() != f"op {target}":
            seen.append(line)
        seen.append(line)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    ops_run = [line[3:].strip() for line in seen + out.splitlines() if line.startswith("op ")]
    budget = budget_of()
    raw = Store(home, reconcile=False)
    problems = [p for p in raw.check(budget=budget) if not p.startswith(ALLOWED_BEFORE_RECONCILE)]
    raw.close()
    store = Store(home)  # start-up reconcile
    problems += [f"after reconcile: {p}" for p in store.check(budget=budget) + (check_bases(store) if deep else [])]
    now = {row["name"] for row in store.names()}
    lost = sorted(before - now - removed_since(store, since))
    store.close()
    return Kill(ops_run[-1] if ops_run else "start", proc.returncode == -signal.SIGKILL, lost, problems)


if __name__ == "__main__":
    worker(Path(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4].split(","))
