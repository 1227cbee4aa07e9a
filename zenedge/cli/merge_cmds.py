"""`zenedge merge A B --method …`: merge profiles by hand (the gate is reported and enforced)."""

from __future__ import annotations

import click

from zenedge.cli.context import load_config
from zenedge.cli.output import json_option, print_json
from zenedge.cli.progress import PoolProgress
from zenedge.merge.methods import MERGE_METHODS
from zenedge.sizes import format_size


@click.command("merge")
@click.argument("names", nargs=-1, required=True)
@click.option("--method", type=click.Choice(list(MERGE_METHODS)), default="opcm", show_default=True,
              help="monosoup edits one adapter; the others merge two or more.")
@click.option("--force", is_flag=True, help="Keep the merge even if a member falls below pool.quality_threshold.")
@json_option
def merge(names: tuple[str, ...], method: str, force: bool, json_out: bool) -> None:
    """Merge the adapters serving NAMES into one that serves them all."""
    from zenedge.cli.backend import backend

    pool = backend(load_config(), start=True)   # a daemon's resident base gates it
    if json_out:
        return print_json(pool.merge(list(names), method, force))
    with PoolProgress() as display:
        result = pool.merge(list(names), method, force, display.update)
    kept = ", ".join(f"{n} {r:.2f}" for n, r in result["retention"].items())
    click.echo(f"merged {', '.join(result['members'])} with {method} ({format_size(result['bytes'])}); "
               f"retention: {kept}")
