"""`zenedge bench load`: the runtime on a quiet machine and on one where other processes hold cores,
with the thread policy's defaults and with one thread, measured in one run (rounds interleaved).

What a user's daemon meets (runtime/threads.py says why it matters): the same work timed under
every (background load, threads) pair, round after round, so that each ratio compares numbers
taken minutes apart on the same machine:

- decode: tokens/s of a 128-token greedy answer after its first token (the base, the CLI's path),
  best of 3;
- prefill: prompt tokens/s of a 512-token prompt (time to its first token), best of 3;
- gate: rows/s of the quality gate scoring 48 rows (3 profiles × 8 examples × base and own
  adapter): what a merging pull spends its time on;
- merging import: wall seconds of `zenedge import` of a LoRA with its eval set into a pool whose one
  slot is taken, through a running daemon (started with the setting, warmed by one generation),
  the pool restored from a snapshot before every round.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any, Callable

from zenedge import paths
from zenedge.bench.load import background_load, describe
from zenedge.bench.pool import _serving, _zenedge

SETTINGS = ("auto", 1)
PROMPT_TOKENS = 512
DECODE_TOKENS = 128
REPEATS = 3               # best of: single short runs on a shared machine are noisy
GATE_PROFILES = ("csvx", "jsonx", "writer")
GATE_EXAMPLES = 8
IMPORTED = "csvx"          # imported into a pool whose one slot holds `writer`: the gate decides a merge
SETTLE = 1.0               # seconds after the load changes before measuring (the policy reads it)


def run(*, load: int = 1, rounds: int = 2, log: Callable[[str], None] = print) -> dict[str, Any]:
    from zenedge.registry.sources import embedded_root

    profiles = embedded_root()
    machine = _machine()          # before any measurement switches the thread policy
    with tempfile.TemporaryDirectory(prefix="zenedge-bench-load-") as tmp:
        env = paths.scratch_environment(tmp, '[runtime]\ndevice = "cpu"\n\n[pool]\nmax_adapters = 1\n')
        env.pop("ZENEDGE_THREADS", None)
        log("pulling writer into a fresh home (converts the default base once)")
        _zenedge(["pull", "writer"], env)
        snapshot = Path(tmp) / "snapshot"
        shutil.copytree(env["ZENEDGE_HOME"], snapshot)
        cases = _InProcess(Path(env["ZENEDGE_HOME"]), Path(env["ZENEDGE_CONFIG"]), profiles)
        samples: dict[str, list[dict]] = {}
        for round_ in range(rounds):
            for processes in (0, load):
                with background_load(processes):
                    time.sleep(SETTLE)
                    for setting in SETTINGS:
                        key = f"{describe(processes)}, threads {setting}"
                        row = cases.measure(setting)
                        row["import_seconds"] = _merging_import(env, snapshot, setting, profiles)
                        samples.setdefault(key, []).append(row)
                        log(f"round {round_ + 1}, {key}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()))
    medians = {key: {metric: statistics.median(r[metric] for r in rows) for metric in rows[0]}
               for key, rows in samples.items()}
    return {"date": date.today().isoformat(), "machine": machine, "background_load": load, "rounds": rounds,
            "samples": samples, "medians": medians, "ratios": _ratios(medians, load)}


class _InProcess:
    """The in-process cases on one engine (the policy switched between measurements)."""

    def __init__(self, home: Path, config_path: Path, profiles: Path):
        import torch

        from zenedge import config
        from zenedge.pool.gate import QualityGate
        from zenedge.runtime.engine import Engine
        from zenedge.runtime.variants import load_lora
        from zenedge.store import Store

        self.engine = Engine(Store(home), config.load(config_path))
        self.resident = self.engine.resident("smollm2-135m")
        gate = QualityGate(self.resident)
        self.rows = []
        for name in GATE_PROFILES:
            adapter = profiles / name / "adapter"
            variant = load_lora(name, "lora", adapter / "adapter_model.safetensors",
                                json.loads((adapter / "adapter_config.json").read_text()), self.resident.device,
                                self.resident.dtype)
            examples = gate.encoded(profiles / name / "eval.jsonl")[1][:GATE_EXAMPLES]
            self.rows += [(v, example) for example in examples for v in (None, variant)]
        self.gate = gate
        self.prompt = torch.randint(1000, 20000, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(0)).tolist()

    def measure(self, setting) -> dict[str, float]:
        from dataclasses import replace

        from zenedge.runtime import threads
        from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate

        threads.configure(setting)
        endless = replace(self.resident, eos_ids=(-1,))          # every answer is DECODE_TOKENS long
        params = SamplingParams(max_tokens=DECODE_TOKENS)

        def first_and_rest(ids: list[int]) -> tuple[float, float]:
            start, first = time.perf_counter(), None
            for _ in generate(endless, [GenerationRequest(ids, None, params)]):
                first = first or time.perf_counter()
            return first - start, time.perf_counter() - first

        short = self.prompt[:16]
        first_and_rest(short)                                    # warm-up
        decode = min(first_and_rest(short)[1] for _ in range(REPEATS))
        prefill = min(first_and_rest(self.prompt)[0] for _ in range(REPEATS))
        self.gate.score(self.rows[:8])                           # warm-up
        gate = min(_timed(self.gate.score, self.rows) for _ in range(2))   # best of 2
        return {"decode_tokens_per_s": (DECODE_TOKENS - 1) / decode, "prefill_tokens_per_s": PROMPT_TOKENS / prefill,
                "gate_rows_per_s": len(self.rows) / gate}


def _timed(work: Callable, *args) -> float:
    start = time.perf_counter()
    work(*args)
    return time.perf_counter() - start


def _merging_import(env: dict[str, str], snapshot: Path, setting, profiles: Path) -> float:
    """Seconds of one `zenedge import` that merges, through a daemon running with `setting`."""
    home = Path(env["ZENEDGE_HOME"])
    shutil.rmtree(home)
    shutil.copytree(snapshot, home)
    env = {**env, "ZENEDGE_THREADS": str(setting)}
    with _serving(env):
        _zenedge(["run", "smollm2-135m", "Hello", "--max-tokens", "2"], env)   # the base resident
        seconds, done = _zenedge(["import", str(profiles / IMPORTED / "adapter"), "--name", IMPORTED,
                                  "--eval", str(profiles / IMPORTED / "eval.jsonl"), "--json"], env)
    if json.loads(done.stdout).get("action") != "merged":
        raise RuntimeError(f"the import did not merge: {done.stdout[:300]}")
    return seconds


def _ratios(medians: dict[str, dict[str, float]], load: int) -> dict[str, dict[str, float]]:
    """busy/quiet with the defaults (per metric: a time for the import, rates elsewhere), and the
    defaults against one thread on a quiet machine."""
    quiet, busy, one = (medians[f"{describe(0)}, threads auto"], medians[f"{describe(load)}, threads auto"],
                        medians[f"{describe(0)}, threads 1"])
    out = {"busy_vs_quiet": {}, "auto_vs_one_thread_quiet": {}}
    for metric in quiet:
        timed = metric.endswith("_seconds")      # lower is better: report time ratios as times
        out["busy_vs_quiet"][metric] = busy[metric] / quiet[metric]
        out["auto_vs_one_thread_quiet"][metric] = (one[metric] / quiet[metric]) if timed else quiet[metric] / one[metric]
    return out


def _machine() -> dict[str, Any]:
    from zenedge.bench.throughput import machine

    return machine()


LABELS = {"decode_tokens_per_s": "decode tok/s", "prefill_tokens_per_s": f"prefill tok/s ({PROMPT_TOKENS} tokens)",
          "gate_rows_per_s": "gate rows/s", "import_seconds": "merging import, s"}


def table(result: dict[str, Any]) -> str:
    medians, ratios = result["medians"], result["ratios"]
    keys = list(medians)
    lines = [f"Run {result['date']} on {result['machine']['cpu']}, {result['machine']['cores']} cores; medians of "
             f"{result['rounds']} interleaved rounds.", "",
             "| work | " + " | ".join(keys) + " | busy / quiet (auto) | auto / 1 thread (quiet) |",
             "|---|" + "---|" * (len(keys) + 2)]
    for metric, label in LABELS.items():
        cells = [f"{medians[key][metric]:.3g}" for key in keys]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ratios['busy_vs_quiet'][metric]:.2f}× | "
                     f"{ratios['auto_vs_one_thread_quiet'][metric]:.2f}× |")
    lines += ["", "Ratios are speed ratios (for the import: the inverse of the time ratio, so above 1 is faster; "
              "busy / quiet of the import is its time ratio)."]
    return "\n".join(lines)
