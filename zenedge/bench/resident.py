"""What a base costs resident (issue [U]): memory, load time and speed, each load in a fresh process.

Three loads of one Hugging Face directory, each in its own child process so that every RSS
figure is that process's alone:
- "quantize": no resident file yet; the load reads the source checkpoint tensor by tensor,
  quantizes it and writes the resident file (runtime/resident_file.py): a base's first load.
- "resident file": the same load again, reading that file: every later load.
- "fp32 reference" (with --reference): transformers' from_pretrained in fp32, what zenedge kept
  resident before (the int4 copies came on top of it): the memory the change removed.
Each child then decodes one request (64 tokens, the thread policy's default: one thread for the C
step) and prefills a 256-token prompt, and reports its RSS after the load, after the run, and its
peak. Load time is to the resident model; "first token" adds a 16-token prompt's first token.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

GIB = 2**30
PREFILL_TOKENS = 256
DECODE_TOKENS = 64


def run(base_dir: Path, *, reference: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    from zenedge import bases
    from zenedge.bench.throughput import machine
    from zenedge.runtime.model import resident_bytes

    base_dir = Path(base_dir)
    params, _ = resident_bytes(base_dir, __import__("torch").float32, "int4")
    source = sum(p.stat().st_size for p in bases.weights_files(base_dir))
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "base_dir": str(base_dir),
                              "parameters": params, "source_bytes": source, "loads": {}}
    with tempfile.TemporaryDirectory(prefix="zenedge-bench-resident-") as tmp:
        cache = Path(tmp) / "resident"
        phases = [("quantize", "int4"), ("resident file", "int4")] + ([("fp32 reference", "full")] if reference else [])
        for label, weights in phases:
            log(f"{label}: loading {base_dir.name} in a fresh process")
            result["loads"][label] = _child(base_dir, cache, weights)
        files = list(cache.glob("*.safetensors"))
        result["resident_file_bytes"] = sum(p.stat().st_size for p in files)
    return result


def _child(base_dir: Path, cache: Path, weights: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "zenedge.bench.resident", str(base_dir), str(cache), weights]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {weights} load failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _measure(base_dir: Path, cache: Path, weights: str) -> dict[str, Any]:
    """One child's run: load, time to first token, decode and prefill speeds, memory."""
    import torch

    from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
    from zenedge.runtime.model import load_resident
    from zenedge.runtime.resident_file import ResidentCache

    before = _rss()
    start = time.perf_counter()
    resident = load_resident("bench", base_dir, torch.device("cpu"), torch.float32, weights,
                             ResidentCache(cache, "bench") if weights != "full" else None)
    loaded = time.perf_counter() - start
    after_load = _rss()
    vocab = resident.model.config.vocab_size
    ids = torch.randint(100, vocab - 1, (PREFILL_TOKENS,), generator=torch.Generator().manual_seed(0)).tolist()

    def timed(prompt, tokens):
        first = None
        began = time.perf_counter()
        count = 0
        for deltas in generate(resident, [GenerationRequest(prompt, None, SamplingParams(max_tokens=tokens))]):
            count += sum(d.token_id is not None for d in deltas)
            if first is None and count:
                first = time.perf_counter()
        return first - began, time.perf_counter() - first, count

    first_token, _, _ = timed(ids[:16], 1)
    prefill, _, _ = timed(ids, 1)
    _, decode, count = timed(ids[:16], DECODE_TOKENS)
    return {"weights": weights, "load_s": round(loaded, 2), "first_token_s": round(loaded + first_token, 2),
            "prefill_tok_s": round(PREFILL_TOKENS / prefill, 1), "decode_tok_s": round((count - 1) / decode, 2),
            "decode_tokens": count,
            "rss_before_gib": round(before / GIB, 3), "rss_loaded_gib": round(after_load / GIB, 3),
            "rss_after_run_gib": round(_rss() / GIB, 3),
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 3)}


def table(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [f"Resident base: {Path(result['base_dir']).name}, {result['parameters'] / 1e9:.2f}B parameters, "
             f"source {result['source_bytes'] / GIB:.2f} GiB, resident file {result['resident_file_bytes'] / GIB:.2f} GiB",
             f"({result['date']}; {m['cpu']}, {m['cores']} cores, C kernels {m['native_kernels']['isa']}, torch {m['torch']})",
             "",
             "| load | weights | load s | first token s | RSS loaded GiB | RSS after run GiB | peak RSS GiB | prefill tok/s | decode tok/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, r in result["loads"].items():
        lines.append(f"| {label} | {r['weights']} | {r['load_s']} | {r['first_token_s']} | {r['rss_loaded_gib']} | "
                     f"{r['rss_after_run_gib']} | {r['peak_rss_gib']} | {r['prefill_tok_s']} | {r['decode_tok_s']} |")
    loads = result["loads"]
    if "quantize" in loads and "resident file" in loads:
        lines.append("")
        lines.append(f"resident file vs quantize: load {loads['quantize']['load_s'] / loads['resident file']['load_s']:.1f}x faster")
    if "fp32 reference" in loads:
        ref = loads["fp32 reference"]
        lines.append(f"resident RSS vs the fp32 reference: {loads['resident file']['rss_after_run_gib'] / ref['rss_after_run_gib']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":     # the child: python -m zenedge.bench.resident BASE_DIR CACHE WEIGHTS
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(json.dumps(_measure(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])))
