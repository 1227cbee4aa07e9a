"""`zenedge bench`: runtime benchmarks on the real default base (torch loaded only when one runs)."""

from __future__ import annotations

from pathlib import Path

import click

from zenedge.cli.output import json_option, print_json


@click.group("bench")
def bench() -> None:
    """Measure the runtime on this machine (results: JSON or the table BENCHMARKS.md records)."""


def _progress(message: str) -> None:
    click.echo(f"[bench] {message}", err=True)


@bench.command("run")
@click.option("--tokens", type=click.IntRange(2, 4096), default=64, show_default=True, help="New tokens per generation.")
@click.option("--repeats", type=click.IntRange(1, 50), default=3, show_default=True, help="Interleaved rounds (medians).")
@click.option("--threads", type=click.IntRange(1, 1024), default=None, help="torch threads (default: torch's).")
@click.option("--base-dir", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="A Hugging Face directory to use instead of the store's default base.")
@json_option
def run(tokens: int, repeats: int, threads: int | None, base_dir: Path | None, json_out: bool) -> None:
    """Decode throughput: transformers' generate vs zenedge (base, LoRA, BitDelta, a mixed batch),
    switch and cold-load times, bytes per token against the copy bandwidth, and the CPU targets."""
    from zenedge.bench.report import markdown, targets
    from zenedge.bench.throughput import Options, run_bench

    result = run_bench(Options(tokens=tokens, repeats=repeats, threads=threads, base_dir=base_dir), _progress)
    result["targets"] = targets(result)
    if json_out:
        print_json(result)
    else:
        click.echo(markdown(result))


@bench.command("dtypes")
@click.option("--prompts", type=click.IntRange(1, 50), default=50, show_default=True)
@click.option("--tokens", type=click.IntRange(1, 1024), default=32, show_default=True)
@click.option("--threads", type=click.IntRange(1, 1024), default=None, help="torch threads (default: torch's).")
@click.option("--base-dir", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None)
@json_option
def dtypes(prompts: int, tokens: int, threads: int | None, base_dir: Path | None, json_out: bool) -> None:
    """Greedy agreement of bf16 with fp32 on short chat prompts (and both speeds)."""
    from zenedge.bench.agreement import run_agreement
    from zenedge.bench.throughput import resolve_base

    if threads:
        import torch

        torch.set_num_threads(threads)
    directory, _, scratch = resolve_base(base_dir, _progress)
    try:
        result = run_agreement(directory, prompts, tokens, _progress)
    finally:
        if scratch is not None:
            scratch.cleanup()
    if json_out:
        print_json(result)
    else:
        click.echo(f"{result['prompts']} prompts × {result['tokens']} tokens: token agreement "
                   f"{result['token_agreement']:.1%}, identical prompts {result['identical_prompts']:.1%}; "
                   f"fp32 {result['seconds']['float32']:.1f} s, bf16 {result['seconds']['bfloat16']:.1f} s")
        for name, loss in result["answer_loss"]["float32"].items():
            click.echo(f"answer loss on {name} ({result['eval_examples']} examples): fp32 {loss:.4f}, "
                       f"bf16 {result['answer_loss']['bfloat16'][name]:.4f}")
