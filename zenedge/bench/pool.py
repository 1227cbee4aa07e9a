"""`zenedge bench pool`: the pool at interactive speed, measured as a user meets it.

A fresh home and config; `zenedge pull FIRST` (which also converts the default base: timed apart);
`zenedge budget set` to about 3.5 LoRA profiles of the registry; then `zenedge pull` of every other
LoRA profile of the registry, one after another. Every command is a fresh `zenedge` process, as a
person typing them runs them, with the thread policy's defaults (ZENEDGE_THREADS=`threads` where
one is given). Each pull's `--json` result carries what the pool did and where its time went
(phases.py); the report is wall time per pull, the medians of the pulls that merged and of those
that only stored adapters smaller (shrink.py), and the whole scenario end to end. The mode says who does the pool's work:

- "cli" (the default, as a user meets it): the first pull starts a background daemon
  (`server.keep_alive`) and every later pull goes through it; its start-up is in that pull's time.
- "local" (`ZENEDGE_KEEP_ALIVE=0`): every pull works in its own process (start-up, imports and the
  base load for the gate included, in every pull that merges).
- "daemon": a `zenedge serve` runs in that home from the start (as Hanzo Desktop keeps one); its
  start-up is timed apart.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import tempfile
import time
from typing import Any, Callable, Iterator

from zenedge import paths
from zenedge.bench import load

BUDGET_PROFILES = 3.5


def lora_profiles() -> list[dict[str, Any]]:
    """The embedded registry's LoRA profiles (name, size), in the index's order."""
    from zenedge.registry.sources import embedded_root

    index = json.loads((embedded_root() / "index.json").read_text())
    return [p for p in index["profiles"] if p["kind"] == "lora"]


def _zenedge(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(paths.cli_command(*args), env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"zenedge {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return seconds, done


MODES = ("cli", "local", "daemon")


def run(*, threads: int | None = None, first: str = "arith", mode: str = "cli",
        log: Callable[[str], None] = print) -> dict[str, Any]:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {MODES}")
    daemon = mode == "daemon"
    profiles = lora_profiles()
    names = [first] + [p["name"] for p in profiles if p["name"] != first]
    budget = int(BUDGET_PROFILES * statistics.median(p["size"] for p in profiles))
    with tempfile.TemporaryDirectory(prefix="zenedge-bench-pool-") as tmp, contextlib.ExitStack() as stack:
        env = {**paths.scratch_environment(tmp, '[runtime]\ndevice = "cpu"\n'),
               "ZENEDGE_THREADS": str(threads or "auto"), "ZENEDGE_KEEP_ALIVE": "0" if mode == "local" else "300"}
        start = time.perf_counter()
        seconds, _ = _zenedge(["base", "list"], env)  # a process's fixed cost: imports, no model
        pulls = []
        setup_seconds, done = _zenedge(["pull", first, "--json"], env)
        log(f"pull {first} (with the base's first-use conversion): {setup_seconds:.1f} s")
        pulls.append(_row(first, setup_seconds, json.loads(done.stdout), first_use=True))
        _zenedge(["budget", "set", f"{budget}B"], env)
        daemon_seconds = stack.enter_context(_serving(env)) if daemon else None
        if daemon:
            log(f"zenedge serve ready in {daemon_seconds:.1f} s")
        for name in names[1:]:
            took, done = _zenedge(["pull", name, "--json"], env)
            row = _row(name, took, json.loads(done.stdout))
            pulls.append(row)
            log(f"pull {name}: {took:.1f} s, {row['action']}"
                + (f" with {', '.join(row['merged_with'])}" if row["merged_with"] else "")
                + (f", evicted {', '.join(row['evicted'])}" if row["evicted"] else ""))
        total = time.perf_counter() - start - (daemon_seconds or 0)  # a running daemon was started before
        _, listed = _zenedge(["list", "--json"], env)
        if mode == "cli":
            _zenedge(["stop"], env)  # the daemon the first pull started, before its home goes
    merged = [p["seconds"] for p in pulls if p["action"] == "merged"]
    compressed = [p["seconds"] for p in pulls if p["action"] == "stored" and p["compressed"]]
    return {"threads": threads, "mode": mode, "daemon": daemon, "daemon_start_seconds": daemon_seconds,
            "budget_bytes": budget, "profiles": names, "process_seconds": seconds,
            "pulls": pulls, "total_seconds": total, "pulls_after_setup_seconds": total - setup_seconds,
            "merged_median_seconds": statistics.median(merged) if merged else None,
            "compressed_median_seconds": statistics.median(compressed) if compressed else None,
            "pool": [{"name": r["name"], "served_by": r["served_by"], "kind": r["kind"]}
                     for r in json.loads(listed.stdout)]}


@contextlib.contextmanager
def _serving(env: dict[str, str]) -> Iterator[float]:
    """`zenedge serve` in the bench's home until the block ends; yields its start-up seconds (until
    `zenedge ps` answers through it)."""
    start = time.perf_counter()
    server = subprocess.Popen(paths.cli_command("serve"), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while subprocess.run(paths.cli_command("ps"), env=env, capture_output=True).returncode:
            if server.poll() is not None:
                raise RuntimeError(f"zenedge serve exited ({server.returncode}): {server.stderr.read().strip()}")
            if time.perf_counter() - start > 300:
                raise RuntimeError("zenedge serve did not answer within 300 s")
            time.sleep(0.5)
        yield time.perf_counter() - start
    finally:
        server.terminate()
        server.wait(timeout=60)


def _row(name: str, seconds: float, result: dict[str, Any], first_use: bool = False) -> dict[str, Any]:
    profile = result.get("profile") or {}
    attempts = result.get("attempts") or []
    return {"name": name, "seconds": round(seconds, 2), "action": result.get("policy", "stored"),
            "merged_with": result.get("merged_with") or [], "evicted": result.get("evicted") or [],
            "compressed": [f"{'+'.join(c['names'])} {c['compressed_to']}" for c in result.get("compressed") or []
                           if c["kept"]],
            "candidates_gated": len(attempts),
            "examples_read": [sum(a.get("examples", {}).values()) for a in attempts],
            "pool_seconds": profile.get("total_seconds"), "by_phase": profile.get("by_phase", {}),
            "first_use": first_use, "attempts": attempts}


def table(result: dict[str, Any]) -> str:
    """Markdown: one row per pull (wall time, what the pool did, where the pool's time went)."""
    lines = ["| pull | wall s | pool s | action | load s | anchors s | gate s | candidates | examples read |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in result["pulls"]:
        what = p["action"] + (f" with {'+'.join(p['merged_with'])}" if p["merged_with"] else "") \
            + (f", evicted {'+'.join(p['evicted'])}" if p["evicted"] else "") \
            + (f"; stored smaller: {', '.join(p['compressed'])}" if p.get("compressed") else "")
        phases = p["by_phase"]
        lines.append(f"| {p['name']}{' (base set-up)' if p['first_use'] else ''} | {p['seconds']:.1f} | "
                     f"{p['pool_seconds'] or 0:.1f} | {what} | {phases.get('load', 0):.1f} | "
                     f"{phases.get('anchors', 0):.1f} | {phases.get('gate', 0):.1f} | {p['candidates_gated']} | "
                     f"{', '.join(map(str, p['examples_read'])) or '-'} |")
    median = result["merged_median_seconds"]
    lines += ["", f"- {len(result['pulls'])} pulls end to end: {result['total_seconds']:.0f} s "
                  f"({result['pulls_after_setup_seconds']:.0f} s after the first pull's base set-up); "
                  f"a bare `zenedge` process: {result['process_seconds']:.1f} s",
              f"- median wall time of a pull that merged: {median:.1f} s" if median is not None
              else "- no pull merged",
              f"- median wall time of a pull that only stored adapters smaller: {result['compressed_median_seconds']:.1f} s"
              if result.get("compressed_median_seconds") is not None else "- no pull only stored adapters smaller",
              f"- budget {result['budget_bytes']} B ({BUDGET_PROFILES} profiles), threads {result['threads'] or 'auto'}"
              f", background load: {load.describe(result.get('background_load', 0))}"]
    if result.get("mode") == "cli":
        lines.append("- the first pull started a background daemon (server.keep_alive); the later pulls went "
                     "through it (its start-up is in the first pull's wall time)")
    elif result.get("mode") == "local" or ("mode" not in result and not result.get("daemon")):
        lines.append("- every pull worked in its own process (ZENEDGE_KEEP_ALIVE=0)")
    if result.get("daemon"):
        lines.append(f"- through a running `zenedge serve` (ready {result['daemon_start_seconds']:.1f} s after the "
                     "first pull; not counted in the pulls' wall time)")
    return "\n".join(lines)
