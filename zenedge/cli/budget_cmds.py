"""`zenedge budget show|set`: the storage budget B for adapters and deltas."""

from __future__ import annotations

import click

from zenedge.cli.context import load_config, open_store
from zenedge.cli.output import json_option, print_json, print_table
from zenedge.sizes import format_size


@click.group("budget")
def budget() -> None:
    """Show or set the storage budget B."""


def budget_status(cfg, store) -> dict:
    usage = store.usage()
    return {
        "budget_bytes": cfg.budget,
        "used_bytes": usage.used_bytes,
        "free_bytes": max(0, cfg.budget - usage.used_bytes),
        "by_kind": usage.by_kind,
        "adapters": usage.adapters,
        "bases_bytes": usage.bases_bytes,
        "config": str(cfg.path),
    }


@budget.command("show")
@json_option
def show(json_out: bool) -> None:
    """Budget, bytes used and free, usage per kind; bases are reported apart from B."""
    cfg = load_config()
    status = budget_status(cfg, open_store())
    if json_out:
        return print_json(status)
    click.echo(f"budget {format_size(status['budget_bytes'])} ({status['config']})")
    click.echo(f"used   {format_size(status['used_bytes'])} in {status['adapters']} adapters")
    click.echo(f"free   {format_size(status['free_bytes'])}")
    if status["by_kind"]:
        print_table(sorted((k, format_size(v)) for k, v in status["by_kind"].items()), ["KIND", "BYTES"])
    click.echo(f"bases  {format_size(status['bases_bytes'])} (not counted in the budget)")


@budget.command("set")
@click.argument("size")
@click.option("--dry-run", is_flag=True, help="Show what would be evicted; change nothing.")
@json_option
def set_(size: str, dry_run: bool, json_out: bool) -> None:
    """Set B (e.g. 16GB, 16GiB, 500MB); below current use, store adapters smaller (quality-checked), then
    evict unpinned adapters, least requested first."""
    from zenedge.cli.backend import backend

    from zenedge.cli.progress import PoolProgress, compressed

    with PoolProgress() as shown:   # through a daemon: in force there at once (its result, no live lines)
        plan = backend(load_config(), start=False).set_budget(size, dry_run, progress=None if json_out else shown.update)
    if json_out:
        return print_json({key: plan[key] for key in ("budget_bytes", "used_before", "used_after", "evict", "dry_run",
                                                      "compressed")})
    if compressed(plan.get("compressed", [])):
        click.echo(compressed(plan["compressed"]))
    elif dry_run and plan["used_before"] > plan["budget_bytes"]:
        click.echo("(storing adapters in smaller formats is tried first: it may evict fewer)")
    verb = "would evict" if dry_run else "evicted"
    if plan["evicted"]:
        print_table([(", ".join(a["names"]), a["kind"], format_size(a["freed_bytes"])) for a in plan["evicted"]],
                    ["NAMES", "KIND", "FREES"], title=f"{verb} (least requested first)")
    prefix = "would set the budget to" if dry_run else "budget set to"
    click.echo(f"{prefix} {format_size(plan['budget_bytes'])}; used {format_size(plan['used_after'])}")
