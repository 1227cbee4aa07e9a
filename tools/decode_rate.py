"""Decode tokens/s on a stored base, as the daemon would run it, and the stack it ran on:
`python tools/decode_rate.py [--base smollm2-135m] [--tokens 128] [--rounds 3]` (JSON on stdout;
by path, so that the installation, not the repository root, is what it imports).

The speed half of CI's canary (.ci/canary.py) runs it in the locked venv and in the newest one,
alternately, on the same home, and compares the two: a ratio within one run, never a timing.
The home is $ZENEDGE_HOME (the base must be stored there: `zenedge pull writer` stores the default).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from importlib.metadata import version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from zenedge.runtime import threads

    threads.prepare_environment()    # before torch starts OpenMP, as the CLI does
    from zenedge import config, paths
    from zenedge.runtime.decode import decode_path
    from zenedge.runtime.device import pick_device, pick_dtype, pick_weights
    from zenedge.runtime.generate import GenerationRequest, SamplingParams, generate
    from zenedge.runtime.model import load_resident
    from zenedge.runtime.prompts import encode_chat
    from zenedge.store import Store

    cfg = config.load(paths.config_path())
    device = pick_device(cfg.runtime.device)
    dtype, weights = pick_dtype(cfg.runtime.dtype, device), pick_weights(cfg.runtime.weights, device)
    threads.configure(cfg.runtime.threads)
    resident = load_resident(args.base, Store(paths.home()).base_dir(args.base), device, dtype, weights)
    resident = dataclasses.replace(resident, eos_ids=(-1,))     # no early stop: exactly --tokens each round
    prompt = encode_chat(resident.tokenizer, [{"role": "user", "content": "Explain what a Python generator is."}])
    request = GenerationRequest(prompt, None, SamplingParams(max_tokens=args.tokens))
    rates = []
    for _ in range(args.rounds):
        steps = generate(resident, [request])
        next(steps)                                    # the prefill and the first token: not decode
        start, produced = time.perf_counter(), 0
        for deltas in steps:
            produced += len(deltas)
        rates.append(produced / (time.perf_counter() - start))
    path = dataclasses.asdict(decode_path(resident.model, resident.device, resident.weights))
    print(json.dumps({"tokens_per_s": max(rates), "rounds": rates, "tokens": args.tokens, "base": args.base,
                      "decode_path": path, "versions": {p: version(p) for p in ("torch", "transformers", "peft")}}))


if __name__ == "__main__":
    main()
