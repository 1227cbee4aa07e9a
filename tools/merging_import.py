"""A merging import at real size (issue [U]'s target): a pool of 5 stored LoRAs on BASE, a budget of
5.5 of them, and a 6th imported with a 50-example eval set, so that the pool must compress or merge
before it fits and the quality gate decides. Times the 6th import in a fresh process (wall time,
peak RSS from /usr/bin/time) and prints its phase profile.

    python -m tools.merging_import /tmp/bases/smollm2-1.7b.Q4_0.gguf /tmp/merging-import

BASE is a GGUF file or a Hugging Face directory (tools/real_size_base.py makes both). WORK gets a
fresh ZENEDGE_HOME, the adapters and the eval set (the embedded arithmetic profile's examples,
repeated up to 50), and its own config file. The adapters are random r=8 LoRAs on q/k/v/o from the base's shapes
(zenedge.bench.variants.make_lora), so the figures are speed and memory, never quality.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = 50
STORED = 5


def _zenedge(env: dict, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zenedge", *args], env=env, check=not capture,
                          capture_output=capture, text=True)


def _daemon_peak(home: Path) -> str:
    """The pool daemon's peak RSS (VmHWM): the import runs there, not in the client."""
    from zenedge.api import discovery

    pid = (discovery.read_info(home) or {}).get("pid")
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (OSError, TypeError):
        return "unknown (no daemon found)"
    kib = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
    return f"{kib / 2**20:.2f} GiB"


def _greedy_answers(home: Path, config: Path, prompts: list[str]) -> list[str]:
    """The temporary `probe` profile's greedy answers (8 tokens at most), in this process."""
    os.environ.update(ZENEDGE_HOME=str(home), ZENEDGE_CONFIG=str(config))
    from zenedge import config as zconfig
    from zenedge.runtime.engine import Engine, Prompt
    from zenedge.runtime.sampling import SamplingParams
    from zenedge.store import Store

    engine = Engine(Store(home), zconfig.load(config))
    params = SamplingParams(max_tokens=8)
    return [engine.complete("probe", Prompt(messages=[{"role": "user", "content": p}]), params).text.strip() or "?"
            for p in prompts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="a GGUF file or a Hugging Face directory")
    parser.add_argument("work", type=Path, help="a scratch folder (emptied first)")
    parser.add_argument("--name", default="real", help="the base's name in the pool")
    parser.add_argument("--merge-only", action="store_true",
                        help='pool.compress_to = "off": the pool merges at once instead of re-storing smaller first')
    parser.add_argument("--own-answers", action="store_true",
                        help="the eval set's answers are the newcomer's own greedy ones (it has a gain)")
    parser.add_argument("--activations", choices=("int16", "int8"), default=None,
                        help="runtime.activations (default: the config's default)")
    parser.add_argument("--cold", action="store_true",
                        help="the import's load is the base's first (no resident file yet)")
    args = parser.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    home, adapters = args.work / "home", args.work / "adapters"
    adapters.mkdir(parents=True)
    config = args.work / "config.toml"
    config.write_text(('[pool]\ncompress_to = "off"\n' if args.merge_only else "")
                      + (f'[runtime]\nactivations = "{args.activations}"\n' if args.activations else ""))
    env = {**os.environ, "ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config), "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    _zenedge(env, "base", "add", str(args.base), "--name", args.name)
    print(f"base add {time.perf_counter() - started:.1f} s", flush=True)

    from zenedge.bench.variants import make_lora

    base_dir = home / "bases" / args.name
    loras = [make_lora(base_dir, adapters / f"lora{i}", seed=i) for i in range(STORED + 1)]
    rows = [json.loads(line) for line in (ROOT / "profiles" / "arith" / "eval.jsonl").read_text().splitlines() if line]
    eval_path = args.work / "eval.jsonl"
    rows = [rows[i % len(rows)] for i in range(EXAMPLES)]
    eval_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for i in range(STORED):
        _zenedge(env, "import", str(loras[i]), "--name", f"p{i}", "--base", args.name)
    if args.own_answers:
        # The newcomer's own greedy answers as the eval set: the gain a real fine-tune has on its
        # task (the random base and adapter gain nothing on arithmetic, a borderline the gate reads
        # whole). Made through a temporary profile, removed before the timed import.
        _zenedge(env, "import", str(loras[STORED]), "--name", "probe", "--base", args.name)
        _zenedge(env, "stop", capture=True)
        answers = _greedy_answers(home, config, [row["prompt"] for row in rows[:EXAMPLES]])
        rows = [{"prompt": row["prompt"], "answer": answer} for row, answer in zip(rows, answers)]
        eval_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        _zenedge(env, "rm", "probe")
    if not args.cold:
        _zenedge(env, "run", args.name, "Hi", "--max-tokens", "1", capture=True)  # writes its resident file
    status = json.loads(_zenedge(env, "pool", "status", "--json", capture=True).stdout)
    size = status["by_kind"]["lora"] // STORED      # as stored (bf16), not as PEFT saved it (fp32)
    _zenedge(env, "budget", "set", str(status["used_bytes"] + size // 2))
    _zenedge(env, "stop", capture=True)     # the import below starts in a fresh process

    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "maxrss %M KB", sys.executable, "-m", "zenedge", "import",
                           str(loras[STORED]), "--name", f"p{STORED}", "--base", args.name, "--eval", str(eval_path),
                           "--json"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        return done.returncode
    report = json.loads(done.stdout)
    client = next(line for line in done.stderr.splitlines() if line.startswith("maxrss"))
    print(f"merging import: {wall:.1f} s wall, daemon peak RSS {_daemon_peak(home)}, client {client}, "
          f"action {report['action']}, adapter {size} bytes")
    _zenedge(env, "stop", capture=True)
    for phase in report["profile"]["phases"]:
        print("  ", json.dumps(phase))
    return 0


if __name__ == "__main__":
    sys.exit(main())
