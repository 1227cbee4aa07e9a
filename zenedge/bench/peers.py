"""llama.cpp as a peer row in `zenedge bench run`: its `llama-bench` decoding from the very GGUF
the embedded base ships as, at the same thread count, its rounds interleaved with zenedge's.

Nothing of llama.cpp ships with zenedge. The bench is given a built `llama-bench` (`--llama-bench
PATH` or ZENEDGE_LLAMA_BENCH; BENCHMARKS.md says how to build one) and leaves the row out with a
note when it has none. Where `llama-quantize` sits beside it, the same weights are also converted
to Q4_0 and Q8_0 (requantized from the shipped Q4_1: a speed comparison, not a quality one).

Each round is one `llama-bench ... -r 1 -o json` process: its own warm-up, then `tokens` decode
steps of one row from an empty context, reported as tokens/s (model loading is not timed).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from zenedge import paths
from zenedge.bench import bandwidth
from zenedge.errors import InvalidInput

SKIPPED = ("llama.cpp: skipped, no llama-bench given (--llama-bench PATH or ZENEDGE_LLAMA_BENCH; "
           "BENCHMARKS.md says how to build one)")
CONVERSIONS = ("Q4_0", "Q8_0")       # what llama-quantize makes of the shipped file, beside it
TIMEOUT_S = 600


@dataclass
class Peer:
    """One llama-bench row: a GGUF, the command that decodes from it, its tokens/s per round."""

    quant: str                        # "Q4_1" (the shipped file) or a conversion of it
    gguf: Path
    command: list[str]
    bytes_per_step: int
    samples: list[float] = field(default_factory=list)
    info: dict = field(default_factory=dict)        # build and CPU as llama-bench reports them

    def warm_up(self) -> None:
        run(self.command)

    def measure(self) -> None:
        found = parse_decode(run(self.command))
        self.info = {k: found[k] for k in ("build", "cpu_info", "model_type", "n_threads")}
        self.samples.append(found["tokens_per_s"])


def locate(explicit: Path | None) -> Path | None:
    """The llama-bench to run: `explicit`, else ZENEDGE_LLAMA_BENCH, else None (the row is skipped).
    One that is named but cannot be run is an error now, not after minutes of benchmarking."""
    path, source = (explicit, "--llama-bench") if explicit is not None else (paths.llama_bench(), "ZENEDGE_LLAMA_BENCH")
    if path is None:
        return None
    if not path.is_file() or not os.access(path, os.X_OK):
        raise InvalidInput(f"{path} ({source}): not an executable llama-bench")
    return path


def command(binary: Path, gguf: Path, threads: int, tokens: int) -> list[str]:
    """`tokens` decode steps of one row, no prompt, one repetition, JSON on stdout."""
    return [str(binary), "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", str(tokens), "-r", "1", "-o", "json"]


def run(argv: list[str]) -> str:
    """stdout of one llama.cpp tool run; a failure is one line naming the tool and its last words."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InvalidInput(f"{Path(argv[0]).name} could not run: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InvalidInput(f"{Path(argv[0]).name} failed (exit {done.returncode}): {last}")
    return done.stdout


def parse_decode(text: str) -> dict:
    """The decode test of llama-bench's `-o json` output (a list of tests; the one with no prompt
    and n_gen > 0): tokens/s (avg_ts), per-repetition samples, and what it ran on."""
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"llama-bench printed no JSON ({exc.msg} at {exc.pos}): is it llama-bench, run with -o json?") from None
    decode = [t for t in tests if isinstance(t, dict) and t.get("n_prompt") == 0 and (t.get("n_gen") or 0) > 0] \
        if isinstance(tests, list) else []
    if len(decode) != 1 or not isinstance(decode[0].get("avg_ts"), (int, float)):
        raise InvalidInput(f"llama-bench's JSON holds {len(decode)} decode tests with a rate, not one")
    t = decode[0]
    return {"tokens_per_s": float(t["avg_ts"]), "samples_ts": [float(x) for x in t.get("samples_ts", [])],
            "n_gen": t["n_gen"], "n_threads": t.get("n_threads"), "model_type": t.get("model_type"),
            "cpu_info": t.get("cpu_info"), "build": f"{t.get('build_commit', '?')} ({t.get('build_number', '?')})"}


def weight_bytes(gguf: Path) -> int:
    """Bytes a decode step reads from a GGUF's weights: every tensor once, except that the token
    embedding is one row per step when an `output.weight` head is there (untied)."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(gguf).tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return sum(tensors.values())


def prepare(binary: Path, gguf: Path, threads: int, tokens: int, kv_step_bytes: int, workdir: Path,
            progress: Callable[[str], None]) -> list[Peer]:
    """The shipped GGUF, plus its conversions where llama-quantize sits beside llama-bench; each
    run once for two tokens here, so a llama-bench that cannot load them fails before the bench."""
    files = {"Q4_1": gguf}
    quantize = binary.with_name("llama-quantize")
    if quantize.is_file() and os.access(quantize, os.X_OK):
        for kind in CONVERSIONS:
            progress(f"llama-quantize: {gguf.name} -> {kind}")
            target = workdir / f"{gguf.stem}.{kind}.gguf"
            run([str(quantize), "--allow-requantize", str(gguf), str(target), kind])
            files[kind] = target
    peers = []
    for kind, path in files.items():
        run(command(binary, path, threads, 2))
        peers.append(Peer(kind, path, command(binary, path, threads, tokens), weight_bytes(path) + kv_step_bytes))
    return peers


def summarise(peer: Peer, zenedge_rates: list[float], copy_bw: float) -> dict:
    """A peer's row: its median tokens/s and zenedge's against it, as the median of the ratios of
    the rounds (each round ran both within seconds, so a neighbour's load hits both)."""
    rate = statistics.median(peer.samples)
    ratios = [z / p for z, p in zip(zenedge_rates, peer.samples)]
    return {"engine": "llama.cpp", "weights": peer.quant, "gguf": peer.gguf.name, "command": peer.command,
            "decode_tokens_per_s": rate, "samples": peer.samples, "bytes_per_step": peer.bytes_per_step,
            "bandwidth_fraction": bandwidth.ratio(peer.bytes_per_step * rate, copy_bw),
            "zenedge_vs_peer": statistics.median(ratios) if ratios else None, **peer.info}
