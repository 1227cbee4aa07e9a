"""Time the pool's merge math on smollm2-shaped adapters: `python -m tools.bench_similarity`.

Adapters: SmolLM2-135M attention, 30 layers × {q, k, v, o}_proj with the real shapes
(q, o: 576×576; k, v: 192×576, 3 kv heads × 64), rank 8, float32, random factors.

Measures (best of --repeat runs; wall clock and process CPU time):
  * SimilarityIndex build over a pool of --pool adapters (per-module norms),
  * one query of a new adapter against that index, and adding one member to it,
  * rank_by_similarity one-shot (build + query), what the pool calls on an arrival,
  * lora_cosine of one pair,
  * low-rank OPCM of two adapters, rank cap 8 (init + one step), and one more step.
Numbers go to stdout; zenedge/merge/README.md keeps a dated copy.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from zenedge.merge.factors import LoraFactors
from zenedge.merge.lowrank_opcm import lowrank_opcm_init, lowrank_opcm_step
from zenedge.merge.similarity import SimilarityIndex, lora_cosine, rank_by_similarity

HIDDEN, KV, LAYERS, RANK = 576, 192, 30, 8
SHAPES = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (KV, HIDDEN), "v_proj": (KV, HIDDEN), "o_proj": (HIDDEN, HIDDEN)}


def smollm2_adapter(gen: torch.Generator, rank: int = RANK) -> dict[str, LoraFactors]:
    adapter = {}
    for layer in range(LAYERS):
        for module, (out_dim, in_dim) in SHAPES.items():
            A = torch.randn(rank, in_dim, generator=gen) / in_dim**0.5
            B = torch.randn(out_dim, rank, generator=gen) * 0.01
            adapter[f"model.layers.{layer}.self_attn.{module}"] = LoraFactors(A, B, 16.0 / rank)
    return adapter


def best_of(repeat: int, fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, process CPU) seconds of the fastest run. On a shared machine the CPU time is the
    better guide to what the code costs; the wall time is what a caller waits."""
    runs = []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        runs.append((time.perf_counter() - wall, time.process_time() - cpu))
    return min(runs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=int, default=100, help="pool size (default 100)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is printed")
    args = parser.parse_args(argv)

    gen = torch.Generator().manual_seed(0)
    pool = {f"adapter-{i}": smollm2_adapter(gen) for i in range(args.pool)}
    new = smollm2_adapter(gen)
    third = smollm2_adapter(gen)
    first = pool["adapter-0"]

    index = SimilarityIndex(pool)
    rows = [
        (f"index build, pool of {args.pool}", best_of(args.repeat, lambda: SimilarityIndex(pool))),
        ("query one new adapter", best_of(args.repeat, lambda: index.query(new))),
        ("index add one member", best_of(args.repeat, lambda: index.add("extra", third))),
        (f"rank_by_similarity one-shot, pool of {args.pool}", best_of(args.repeat, lambda: rank_by_similarity(new, pool))),
        ("lora_cosine, one pair", best_of(args.repeat, lambda: lora_cosine(new, first))),
        ("low-rank OPCM, 2 adapters, cap 8", best_of(args.repeat, lambda: lowrank_opcm_step(lowrank_opcm_init(first, 8), new, 0.5, 8))),
    ]
    state = lowrank_opcm_step(lowrank_opcm_init(first, 8), new, 0.5, 8)
    rows.append(("low-rank OPCM, one more step", best_of(args.repeat, lambda: lowrank_opcm_step(state, third, 0.5, 8))))

    modules = len(first)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {modules} modules/adapter, r={RANK}, float32")
    print(f"{'':<45} {'wall':>9}    {'cpu':>9}")
    for label, (wall, cpu) in rows:
        print(f"{label:<45} {wall * 1e3:9.1f} ms {cpu * 1e3:9.1f} ms")
    print(f"energy kept by the cap-8 merge of 2: {state.truncation.energy_kept_overall:.4f}")


if __name__ == "__main__":
    main()
