"""`zenedge bench`: runtime benchmarks on the real default base (torch loaded only when one runs)."""

from __future__ import annotations

from pathlib import Path

import click

from zenedge.cli.output import json_option, print_json


@click.group("bench")
def bench() -> None:
    """Measure the runtime on this machine (results: JSON or the table BENCHMARKS.md records)."""


threads_option = click.option("--threads", type=click.IntRange(1, 1024), default=None,
                              help='torch threads (default: the thread policy\'s "auto", as users get it).')
load_option = click.option("--background-load", type=click.IntRange(0, 256), default=0, show_default=True,
                           metavar="N", help="Hold N busy processes while measuring (a machine with other work on it).")


def _progress(message: str) -> None:
    click.echo(f"[bench] {message}", err=True)


base_option = click.option("--base", "base_name", default=None, metavar="NAME",
                           help="A registered base (`zenedge base list`) instead of a directory.")


def _base_dir(base_name: str | None, base_dir: Path | None) -> Path | None:
    """The directory to measure: --base-dir as given, or a registered base's store directory."""
    if base_name is None:
        return base_dir
    if base_dir is not None:
        raise click.UsageError("give --base or --base-dir, not both")
    from zenedge import bases
    from zenedge.cli.context import open_store

    store = open_store()
    return store.home / bases.ensure_base(store, base_name, progress=_progress)["dir"]


@bench.command("run")
@click.option("--tokens", type=click.IntRange(2, 4096), default=64, show_default=True, help="New tokens per generation.")
@click.option("--repeats", type=click.IntRange(1, 50), default=3, show_default=True, help="Interleaved rounds (medians).")
@threads_option
@load_option
@click.option("--base-dir", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="A Hugging Face directory to use instead of the store's default base.")
@base_option
@click.option("--llama-bench", "llama_bench", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              default=None, help="A built llama.cpp llama-bench: its decode of the same GGUF as peer rows "
                                 "(default: $ZENEDGE_LLAMA_BENCH; none: the rows are skipped).")
@click.option("--isa", type=click.Choice(["avx512vnni", "avx512", "avx2", "neon", "scalar", "off"]), default=None,
              help="The C kernels' instruction set (as ZENEDGE_CPU_ISA; default: the best this CPU runs), e.g. "
                   "avx2 on an AVX-512 machine to measure what laptops without AVX-512 get.")
@json_option
def run(tokens: int, repeats: int, threads: int | None, background_load: int, base_dir: Path | None,
        base_name: str | None, llama_bench: Path | None, isa: str | None, json_out: bool) -> None:
    """Decode throughput: transformers' generate vs zenedge (base, LoRA, BitDelta packed and dense,
    batches of 2-16 rows of the base and of mixed variants, each against one base row), llama.cpp
    on the same GGUF when given, switch and cold-load times, bytes per token against the copy
    bandwidth, and the CPU targets."""
    import os

    if isa is not None:   # before anything asks for the kernels: they are chosen once per process
        os.environ["ZENEDGE_CPU_ISA"] = isa
    from zenedge.bench.load import background_load as held
    from zenedge.bench.report import markdown, targets
    from zenedge.bench.throughput import Options, run_bench

    base_dir = _base_dir(base_name, base_dir)
    with held(background_load):
        result = run_bench(Options(tokens=tokens, repeats=repeats, threads=threads, base_dir=base_dir,
                                   llama_bench=llama_bench), _progress)
    result["background_load"] = background_load
    result["targets"] = targets(result)
    if json_out:
        print_json(result)
    else:
        click.echo(markdown(result))


@bench.command("dtypes")
@click.option("--prompts", type=click.IntRange(1, 50), default=50, show_default=True)
@click.option("--tokens", type=click.IntRange(1, 1024), default=32, show_default=True)
@click.option("--against", default="bfloat16,int8,int4", show_default=True,
              help="Precisions compared with fp32 (bfloat16, int8, int4 weights).")
@threads_option
@click.option("--base-dir", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None)
@json_option
def dtypes(prompts: int, tokens: int, against: str, threads: int | None, base_dir: Path | None, json_out: bool) -> None:
    """Greedy agreement of bf16 / int8 / int4 weights with fp32, answer losses and speeds."""
    from zenedge.bench.agreement import run_agreement
    from zenedge.bench.throughput import resolve_base

    from zenedge.bench.throughput import PRECISIONS

    labels = tuple(part.strip() for part in against.split(",") if part.strip())
    unknown = [label for label in labels if label not in PRECISIONS[1:]]
    if unknown or not labels:
        raise click.BadParameter(f"unknown precision {unknown[0] if unknown else ''!r}: choose from "
                                 f"{', '.join(PRECISIONS[1:])}", param_hint="--against")
    from zenedge.runtime import threads as thread_policy

    thread_policy.configure(threads or "auto")
    directory, _, scratch = resolve_base(base_dir, _progress)
    try:
        result = run_agreement(directory, prompts, tokens, _progress, labels)
    finally:
        if scratch is not None:
            scratch.cleanup()
    if json_out:
        print_json(result)
        return
    click.echo(f"{result['prompts']} prompts × {result['tokens']} tokens, greedy; fp32 took {result['seconds']['float32']:.1f} s")
    for label, agree in result["agreement"].items():
        click.echo(f"{label}: token agreement {agree['token_agreement']:.1%}, identical prompts "
                   f"{agree['identical_prompts']:.1%}, {result['seconds'][label]:.1f} s")
    sets = list(result["answer_loss"]["float32"])
    click.echo("answer loss (" + f"{result['eval_examples']} examples each): " + ", ".join(sets))
    for label, loss in result["answer_loss"].items():
        click.echo(f"  {label:>8}: " + "  ".join(f"{loss[name]:.4f}" for name in sets))


def _int_list(ctx, param, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        slots = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 2,3,4,5, got {value!r}") from None
    if any(k < 1 for k in slots):
        raise click.BadParameter("every value must be at least 1")
    return slots


def _fraction_list(ctx, param, value: str | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        values = tuple(float(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers like 0.5,0.7, got {value!r}") from None
    if any(not 0 <= v <= 1 for v in values):
        raise click.BadParameter("thresholds are retentions between 0 and 1")
    return values


@bench.command("merge")
@click.option("--profiles", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="A registry folder with LoRA profiles and eval sets (default: the embedded one).")
@click.option("--only", default=None, help="Comma-separated profile names to use (default: every LoRA profile).")
@click.option("--orders", type=click.IntRange(1, 20), default=3, show_default=True, help="Random arrival orders.")
@click.option("--first-order", type=click.IntRange(0, 1000), default=0, show_default=True,
              help="Index of the first arrival order; each index is one fixed shuffle, so "
                   "--orders 3 --first-order 3 adds orders 3-5 to a run of orders 0-2.")
@click.option("--slots", default="2,3,4,5", show_default=True, callback=_int_list, help="Slot counts K.")
@click.option("--budget-bytes", "budget_units", default=None, callback=_int_list,
              help="Byte budgets instead of slot counts, in bf16 r=8 adapters (e.g. 2,3,4,5), the slot limit "
                   "off: zenedge rows merge only, and compress then merge; the baselines get that many slots.")
@click.option("--examples", type=click.IntRange(1, 1000), default=32, show_default=True,
              help="Eval examples scored per profile.")
@click.option("--thresholds", default=None, callback=_fraction_list,
              help="Quality-gate thresholds, one zenedge column each (default: pool.quality_threshold).")
@click.option("--gate-examples", type=click.IntRange(1, 1000), default=32, show_default=True,
              help="Eval examples the gate uses (taken after the scored ones, never the same).")
@click.option("--methods", default="zenedge,kmerge,ties,dare,random", show_default=True)
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write every row as JSON here.")
@json_option
def merge(profiles: Path | None, only: str | None, orders: int, first_order: int, slots: tuple[int, ...],
          budget_units: tuple[int, ...] | None, examples: int, thresholds: tuple[float, ...] | None,
          gate_examples: int, methods: str, out: Path | None, json_out: bool) -> None:
    """The K-Merge proof: every profile arrives in turn into K slots; normalised score S per method
    (zenedge = OPCM + quality gate, K-Merge as published, TIES, DARE, random slot)."""
    from zenedge.bench import merge as merge_bench

    try:
        result = merge_bench.run(profiles, only=[n.strip() for n in only.split(",")] if only else None,
                                 orders=orders, first_order=first_order, slot_counts=slots,
                                 budget_units=budget_units, examples=examples, thresholds=thresholds,
                                 gate_examples=gate_examples,
                                 methods=[m.strip() for m in methods.split(",") if m.strip()], log=_progress)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    _report(result, out, json_out, merge_bench.table)


@bench.command("storage")
@click.option("--profiles", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="A registry folder with LoRA profiles and eval sets (default: the embedded one).")
@click.option("--examples", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="Eval examples scored per profile.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write the result as JSON here.")
@json_option
def storage(profiles: Path | None, examples: int, out: Path | None, json_out: bool) -> None:
    """What storing each profile in int8 and int4 keeps of its gain (answer loss, exact match), and the bytes."""
    from zenedge.bench import storage as storage_bench

    _report(storage_bench.run(profiles, examples=examples, log=_progress), out, json_out, storage_bench.table)


@bench.command("pool")
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="ZENEDGE_THREADS for every zenedge process (default: the thread policy's \"auto\", as users get it).")
@load_option
@click.option("--first", default="arith", show_default=True, help="The profile pulled first, before the budget is set.")
@click.option("--mode", type=click.Choice(["cli", "local", "daemon"]), default="cli", show_default=True,
              help="cli: the first pull starts a background daemon, as for a user; local: every pull in its own "
                   "process (ZENEDGE_KEEP_ALIVE=0); daemon: a `zenedge serve` runs from the start, timed apart.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write the result as JSON here.")
@json_option
def pool(threads: int | None, background_load: int, first: str, mode: str, out: Path | None, json_out: bool) -> None:
    """The pool at interactive speed: a fresh home, the budget set to ~3.5 profiles, then `zenedge pull`
    of every LoRA profile of the registry, each a fresh CLI process: wall time per pull and what it did."""
    from zenedge.bench import pool as pool_bench
    from zenedge.bench.load import background_load as held

    with held(background_load):
        result = pool_bench.run(threads=threads, first=first, mode=mode, log=_progress)
    result["background_load"] = background_load
    _report(result, out, json_out, pool_bench.table)


@bench.command("load")
@click.option("--background-load", type=click.IntRange(1, 256), default=1, show_default=True, metavar="N",
              help="Busy processes in the loaded rounds.")
@click.option("--rounds", type=click.IntRange(1, 20), default=2, show_default=True, help="Interleaved rounds (medians).")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write the result as JSON here.")
@json_option
def load(background_load: int, rounds: int, out: Path | None, json_out: bool) -> None:
    """Quiet vs busy in one run: decode, prefill, the gate's scoring and a merging import, with the
    thread policy's defaults and with one thread (a fresh home; about 6 minutes for 2 rounds here)."""
    from zenedge.bench import under_load

    _report(under_load.run(load=background_load, rounds=rounds, log=_progress), out, json_out, under_load.table)


@bench.command("resident")
@click.option("--base-dir", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None,
              help="A Hugging Face directory (e.g. one tools/real_size_base.py built) or a base's store directory.")
@base_option
@click.option("--reference", is_flag=True, help="Also load it as fp32 weights (transformers' own load), for comparison.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write the result as JSON here.")
@json_option
def resident(base_dir: Path | None, base_name: str | None, reference: bool, out: Path | None, json_out: bool) -> None:
    """A base's memory and load time, each load in a fresh process: quantizing from the source,
    then from its resident file (and fp32 with --reference); decode and prefill after each."""
    from zenedge.bench import resident as measured

    base_dir = _base_dir(base_name, base_dir)
    if base_dir is None:
        raise click.UsageError("give --base NAME or --base-dir DIR")

    _report(measured.run(base_dir, reference=reference, log=_progress), out, json_out, measured.table)


@bench.command("serve")
@click.option("--clients", default="1,4,8,16", show_default=True, callback=_int_list,
              help="Concurrent clients, each on its own profile (1 must be among them for the ratios).")
@click.option("--tokens", type=click.IntRange(2, 4096), default=64, show_default=True, help="New tokens per request.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write the result as JSON here.")
@base_option
@json_option
def serve(clients: tuple[int, ...], tokens: int, out: Path | None, base_name: str | None, json_out: bool) -> None:
    """Many clients at once through a real daemon: N streaming `openai` clients on N profiles
    (LoRA and BitDelta) together and one after another: aggregate tokens/s, time to first token,
    inter-token latency (a fresh home; a few minutes)."""
    from zenedge.bench import serve as serving

    base = (base_name, _base_dir(base_name, None)) if base_name else None
    _report(serving.run(clients=clients, tokens=tokens, log=_progress, base=base), out, json_out, serving.table)


def _report(result: dict, out: Path | None, json_out: bool, table) -> None:
    """A benchmark's result: to `out` as JSON if asked, then as JSON or its table on stdout."""
    import json

    if out is not None:
        out.write_text(json.dumps(result, indent=2, default=str))
    if json_out:
        print_json(result)
    else:
        click.echo(table(result))
