"""`zenedge bench serve`: many clients at once through a real daemon, as a desktop app's chats and
agents meet it.

A fresh home gets the default base and one profile per client (LoRA r=8 adapters and BitDelta
deltas made on the spot, as `bench run` makes them: their quality is irrelevant, their formats and
load paths are the real ones). `zenedge serve` runs on loopback TCP with a bearer token, and the
official `openai` client streams greedy chat completions from it, each client on its own profile:

- concurrent: N clients start together (N threads, one client each);
- one after another: the same N requests, each alone.

For each N: aggregate completion tokens/s (all tokens over the wall time from the first request to
the last token), time to first token and inter-token latency (gaps between streamed tokens,
p50/p95 over every client's gaps), and the concurrent aggregate against one client alone. Every
profile serves one warm-up request first, so the numbers are a hot daemon's.
"""

from __future__ import annotations

import secrets
import socket
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Callable

from zenedge import paths
from zenedge.bases import GGUF_FILE
from zenedge.bench.pool import _serving, _zenedge

CLIENTS = (1, 4, 8, 16)
TOKENS = 64
PROMPTS = ("Write a short story about a lighthouse keeper who finds a message in a bottle.",
           "Explain how a bicycle stays upright, step by step.",
           "Describe a busy market in the morning, with its sounds and smells.",
           "Tell me about the history of the printing press.")
BITDELTA_EVERY = 4             # one profile in four is a BitDelta variant, the others LoRAs
# Issue [O]: 8 clients on 8 profiles
TARGET_AGGREGATE = 3.5         # aggregate tokens/s vs one client
TARGET_LATENCY = 2.5           # each client's inter-token p95 vs its own figure alone


@dataclass
class Stream:
    """One streamed completion, timed as its client saw it."""

    profile: str
    started: float = 0.0
    arrivals: list[float] = field(default_factory=list)   # when each content chunk arrived
    tokens: int = 0                                        # completion tokens (the usage the daemon reports)

    @property
    def first_token_s(self) -> float:
        return self.arrivals[0] - self.started

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]


def run(*, clients: tuple[int, ...] = CLIENTS, tokens: int = TOKENS, log: Callable[[str], None] = print,
        base: tuple[str, Path] | None = None) -> dict:
    """`base`: (name, its store directory) of a registered base to serve instead of the default
    one; it is added to the fresh home from that directory (its GGUF file, or its checkpoint)."""
    try:
        from openai import OpenAI
    except ImportError:
        from zenedge.errors import Unavailable

        raise Unavailable("bench serve measures through the official openai client: pip install openai") from None
    most = max(clients)
    with tempfile.TemporaryDirectory(prefix="zenedge-bench-serve-") as tmp:
        port = _free_port()
        config = (f'[runtime]\ndevice = "cpu"\n\n[pool]\nbudget = "4GiB"\nmax_adapters = {most + 1}\n\n'
                  f'[server]\ntcp = "127.0.0.1:{port}"\n')
        env = {**paths.scratch_environment(tmp, config), "ZENEDGE_TOKEN": secrets.token_hex(16)}
        if base is None:
            base_name = "smollm2-135m"
            log("pulling writer into a fresh home (converts the default base once)")
            _zenedge(["pull", "writer"], env)
        else:
            base_name, directory = base
            source = directory / GGUF_FILE if (directory / GGUF_FILE).is_file() else directory
            log(f"adding base {base_name} to a fresh home, from {source}")
            _zenedge(["base", "add", str(source), "--name", base_name], env)
        profiles = _make_profiles(Path(tmp), Path(env["ZENEDGE_HOME"]), Path(env["ZENEDGE_CONFIG"]), most, log,
                                  base_name)
        with _serving(env):
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=env["ZENEDGE_TOKEN"], max_retries=0)
            log(f"warming {len(profiles)} profiles in the daemon")
            for profile in profiles:
                _stream(client, profile, PROMPTS[0], 2)
            rows = []
            for n in clients:
                chosen = profiles[:n]
                together = _concurrently(client, chosen, tokens)
                apart = [_stream(client, profile, PROMPTS[i % len(PROMPTS)], tokens) for i, profile in enumerate(chosen)]
                rows.append(_row(n, together, apart))
                log(f"{n} clients: {rows[-1]['aggregate_tokens_per_s']:.1f} tok/s together, "
                    f"{rows[-1]['sequential_tokens_per_s']:.1f} one after another")
    one = next((r for r in rows if r["clients"] == 1), None)
    for row in rows:
        row["aggregate_vs_one_client"] = row["aggregate_tokens_per_s"] / one["aggregate_tokens_per_s"] if one else None
    from zenedge.bench.throughput import machine

    return {"date": date.today().isoformat(), "machine": machine(), "tokens": tokens, "rows": rows,
            "profiles": {"lora": sum(1 for p in profiles if p.startswith("lora")),
                         "bitdelta": sum(1 for p in profiles if p.startswith("delta"))}}


def _make_profiles(tmp: Path, home: Path, config_path: Path, count: int, log, base_name: str) -> list[str]:
    """`count` profiles stored in the home, named lora-i / delta-i, interleaved as they are used."""
    from zenedge import config, pool
    from zenedge.bench.variants import make_bitdelta, make_lora
    from zenedge.store import Store

    store, cfg = Store(home), config.load(config_path)
    base = store.base(base_name)
    base_dir = home / base["dir"]
    names = []
    for i in range(count):
        if i % BITDELTA_EVERY == BITDELTA_EVERY - 1:
            name = f"delta-{i}"
            log(f"making {name} (a BitDelta of random signs)")
            path = make_bitdelta(base_dir, tmp / f"{name}.bitdelta", seed=100 + i, base_sha256=base["sha256"])
            pool.import_bitdelta(store, cfg, path, name, base=base_name)
        else:
            name = f"lora-{i}"
            log(f"making {name} (a PEFT LoRA, r=8)")
            pool.import_lora(store, cfg, make_lora(base_dir, tmp / name, seed=i), name, base=base_name)
        names.append(name)
    return names


def _stream(client, profile: str, prompt: str, tokens: int, start_at: threading.Barrier | None = None) -> Stream:
    out = Stream(profile)
    if start_at is not None:
        start_at.wait()
    out.started = time.perf_counter()
    chunks = client.chat.completions.create(model=profile, messages=[{"role": "user", "content": prompt}],
                                            max_tokens=tokens, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            out.arrivals.append(time.perf_counter())
        if chunk.usage is not None:
            out.tokens = chunk.usage.completion_tokens
    if not out.arrivals:
        raise RuntimeError(f"{profile}: the stream carried no tokens")
    return out


def _concurrently(client, profiles: list[str], tokens: int) -> list[Stream]:
    barrier = threading.Barrier(len(profiles))
    results: list[Stream | BaseException | None] = [None] * len(profiles)

    def one(i: int) -> None:
        try:
            results[i] = _stream(client, profiles[i], PROMPTS[i % len(PROMPTS)], tokens, barrier)
        except BaseException as exc:       # re-raised below, in the caller's thread
            results[i] = exc

    workers = [threading.Thread(target=one, args=(i,)) for i in range(len(profiles))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


def _row(n: int, together: list[Stream], apart: list[Stream]) -> dict[str, Any]:
    wall = max(s.arrivals[-1] for s in together) - min(s.started for s in together)
    alone_wall = sum(s.arrivals[-1] - s.started for s in apart)
    own = {s.profile: s for s in apart}
    # each client's inter-token p95 together over its own alone (every client's, then the worst)
    slowdowns = [_percentile(s.gaps, 95) / _percentile(own[s.profile].gaps, 95) for s in together
                 if len(s.gaps) > 1 and len(own[s.profile].gaps) > 1]
    gaps, alone_gaps = [g for s in together for g in s.gaps], [g for s in apart for g in s.gaps]
    return {
        "clients": n,
        "tokens": sum(s.tokens for s in together),
        "aggregate_tokens_per_s": sum(s.tokens for s in together) / wall,
        "sequential_tokens_per_s": sum(s.tokens for s in apart) / alone_wall,
        "first_token_ms": {"p50": 1e3 * statistics.median(s.first_token_s for s in together),
                           "p95": 1e3 * _percentile([s.first_token_s for s in together], 95),
                           "alone_p50": 1e3 * statistics.median(s.first_token_s for s in apart)},
        "inter_token_ms": {"p50": 1e3 * statistics.median(gaps), "p95": 1e3 * _percentile(gaps, 95),
                           "alone_p50": 1e3 * statistics.median(alone_gaps),
                           "alone_p95": 1e3 * _percentile(alone_gaps, 95)},
        "worst_client_p95_vs_alone": max(slowdowns) if slowdowns else None,
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def targets(result: dict) -> list[dict[str, Any]]:
    """The [O] targets for 8 clients, where measured."""
    row = next((r for r in result["rows"] if r["clients"] == 8), None)
    if row is None or row.get("aggregate_vs_one_client") is None:
        return []
    out = [{"name": "8 clients on 8 profiles: aggregate vs one client", "target": f">= {TARGET_AGGREGATE:g}x",
            "value": row["aggregate_vs_one_client"], "met": row["aggregate_vs_one_client"] >= TARGET_AGGREGATE}]
    worst = row["worst_client_p95_vs_alone"]
    if worst is not None:
        out.append({"name": "8 clients: each client's inter-token p95 vs alone", "target": f"<= {TARGET_LATENCY:g}x",
                    "value": worst, "met": worst <= TARGET_LATENCY})
    return out


def table(result: dict) -> str:
    m = result["machine"]
    lines = [f"Run {result['date']} on {m['cpu']}, {m['cores']} cores; {result['tokens']} new tokens per request, "
             f"greedy, streamed through `zenedge serve` (loopback TCP) with the official `openai` client; profiles: "
             f"{result['profiles']['lora']} LoRA, {result['profiles']['bitdelta']} BitDelta, one per client.", "",
             "| clients | together tok/s | ÷ one client | one after another tok/s | first token p50 / p95 (alone p50) | "
             "inter-token p50 / p95 (alone p50 / p95) | worst client p95 ÷ alone |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        ft, it = r["first_token_ms"], r["inter_token_ms"]
        ratio = "–" if r.get("aggregate_vs_one_client") is None else f"{r['aggregate_vs_one_client']:.2f}×"
        worst = "–" if r["worst_client_p95_vs_alone"] is None else f"{r['worst_client_p95_vs_alone']:.2f}×"
        lines.append(f"| {r['clients']} | {r['aggregate_tokens_per_s']:.1f} | {ratio} | "
                     f"{r['sequential_tokens_per_s']:.1f} | {ft['p50']:.0f} / {ft['p95']:.0f} ms ({ft['alone_p50']:.0f}) | "
                     f"{it['p50']:.1f} / {it['p95']:.1f} ms ({it['alone_p50']:.1f} / {it['alone_p95']:.1f}) | {worst} |")
    checks = targets(result)
    if checks:
        lines += ["", "| target | wanted | measured | met |", "|---|---|---|---|"]
        for t in checks:
            lines.append(f"| {t['name']} | {t['target'].replace('x', '×')} | {t['value']:.2f}× | "
                         f"{'yes' if t['met'] else '**no**'} |")
    return "\n".join(lines)
