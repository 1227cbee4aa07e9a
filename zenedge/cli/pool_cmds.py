"""Commands on the pool's contents: list, import, rm, pin/unpin, and `pool status|check|gc`."""

from __future__ import annotations

import time
from pathlib import Path

import click

from zenedge.cli.context import load_config, open_store
from zenedge.cli.output import ago, json_option, print_json, print_table
from zenedge.cli.progress import PoolProgress, echo_outcome
from zenedge.sizes import format_size


@click.group("pool")
def pool() -> None:
    """Inspect and repair the pool."""


def register(app: click.Group) -> None:
    for command in (list_cmd, import_cmd, rm_cmd, pin_cmd, unpin_cmd, pool):
        app.add_command(command)


@click.command("list")
@json_option
def list_cmd(json_out: bool) -> None:
    """List the profiles in the pool (name, kind, size, the adapter serving it)."""
    cfg = load_config()  # first: a broken config changes nothing
    from zenedge.pool.listing import entries as pool_entries

    entries = pool_entries(open_store(), cfg)
    if json_out:
        return print_json(entries)
    now = time.time()
    print_table(
        [(e["name"] + (" (pinned)" if e["pinned"] else ""),
          e["kind"] + (f" ({e['compressed_to']})" if e["compressed_to"] else ""), format_size(e["bytes"]),
          e["served_by"] + (f" (+{e['shared_with']})" if e["shared_with"] else ""), e["base"],
          ago(now - e["last_used_at"])) for e in entries],
        ["NAME", "KIND", "SIZE", "SERVED BY", "BASE", "USED"],
        empty="the pool is empty: try `zenedge pull writer`",
    )


@click.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--name", "-n", required=True, help="Profile name to store it under.")
@click.option("--base", default=None, help="Base model name (default: smollm2-135m).")
@click.option("--eval", "eval_set", type=click.Path(path_type=Path), default=None,
              help="Eval set (JSONL of prompt/answer) for the quality gate.")
@json_option
def import_cmd(path: Path, name: str, base: str | None, eval_set: Path | None, json_out: bool) -> None:
    """Import a PEFT LoRA directory, or a .bitdelta file made by `zenedge compress`."""
    from zenedge.cli.backend import backend

    pool = backend(load_config(), start=True)   # a daemon's resident base gates a merge: no second load here
    if json_out:
        return print_json(pool.import_(path, name, base, eval_set))
    with PoolProgress() as display:
        result = pool.import_(path, name, base, eval_set, display.update)
    echo_outcome(f"imported {result['name']} ({result['kind']}, {format_size(result['bytes'])})", result)


@click.command("rm")
@click.argument("name")
@json_option
def rm_cmd(name: str, json_out: bool) -> None:
    """Remove a profile (its adapter too, unless another name shares it)."""
    from zenedge.cli.backend import backend

    result = backend(load_config(), start=False).rm(name)   # through a daemon, its cached variant goes too
    if json_out:
        return print_json(result)
    click.echo(f"removed {name}; freed {format_size(result['freed_bytes'])}")


@click.command("pin")
@click.argument("name")
def pin_cmd(name: str) -> None:
    """Never evict this profile's adapter under pressure."""
    from zenedge.cli.backend import backend

    backend(load_config(), start=False).pin(name, True)
    click.echo(f"pinned {name}")


@click.command("unpin")
@click.argument("name")
def unpin_cmd(name: str) -> None:
    """Let this profile's adapter be evicted again under pressure."""
    from zenedge.cli.backend import backend

    backend(load_config(), start=False).pin(name, False)
    click.echo(f"unpinned {name}")


@pool.command("status")
@json_option
def status_cmd(json_out: bool) -> None:
    """Budget, usage, slots and the last events."""
    cfg = load_config()
    store = open_store()
    usage = store.usage()
    status = {
        "budget_bytes": cfg.budget, "used_bytes": usage.used_bytes,
        "free_bytes": max(0, cfg.budget - usage.used_bytes), "by_kind": usage.by_kind,
        "adapters": usage.adapters, "max_adapters": cfg.pool.max_adapters,
        "names": len(store.names()), "merges": len(store.merges()),
        "partial_downloads": store.partial_downloads(),
        "events": [{k: e[k] for k in ("at", "kind", "name", "detail")} for e in store.events(10)],
    }
    if json_out:
        return print_json(status)
    click.echo(f"budget {format_size(cfg.budget)}, used {format_size(usage.used_bytes)}, "
               f"free {format_size(status['free_bytes'])}; {usage.adapters}/{status['max_adapters']} adapters "
               f"serving {status['names']} names; {status['merges']} merges")
    if status["partial_downloads"]["count"] or status["partial_downloads"]["active"]:
        click.echo(_partials_line(status["partial_downloads"]))
    now = time.time()
    print_table([(ago(now - e["at"]), e["kind"], e["name"] or "", _short(e["detail"])) for e in status["events"]],
                ["WHEN", "EVENT", "NAME", "DETAIL"], title="recent events", empty="no events yet")


def _partials_line(partials: dict) -> str:
    active = f"{partials['active']} downloading now; " if partials["active"] else ""
    return (f"partial downloads: {active}{partials['count']} left by interrupted pulls "
            f"({format_size(partials['bytes'])}; a new pull resumes them, `zenedge pool gc` removes them)")


def _short(detail) -> str:
    if not isinstance(detail, dict):
        return str(detail or "")
    return ", ".join(f"{k}={v}" for k, v in detail.items())[:80]


@pool.command("check")
@click.option("--deep", is_flag=True, help="Also re-hash the bases' weights in full.")
@json_option
def check_cmd(deep: bool, json_out: bool) -> None:
    """Verify the pool's invariants; exit 65 (damaged data) if any is broken."""
    cfg = load_config()
    store = open_store()
    problems = store.check(budget=cfg.budget)
    if deep:
        from zenedge.bases import check_bases

        problems += check_bases(store)
    partials = store.partial_downloads()  # not a broken invariant: reported, not a failure
    if json_out:
        print_json({"ok": not problems, "problems": problems, "partial_downloads": partials})
    elif problems:
        for problem in problems:
            click.echo(f"problem: {problem}")
    else:
        click.echo("ok: the pool is consistent")
    if not json_out and (partials["count"] or partials["active"]):
        click.echo(f"note: {_partials_line(partials)}")
    if problems:   # the README's exit table: 65 is damaged data, with its one `error:` line
        from zenedge.errors import StoreCorrupt

        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        raise StoreCorrupt(f"the pool check found {count} ({'in the JSON' if json_out else 'listed above'})",
                           hint="`zenedge pull NAME` stores a damaged profile again, `zenedge pool gc` removes "
                                "leftovers, `zenedge pool recover` rebuilds a damaged index")


@pool.command("recover")
@json_option
def recover_cmd(json_out: bool) -> None:
    """Rebuild a damaged or lost index from the stored files (the old one is kept aside; nothing is deleted)."""
    from zenedge import paths
    from zenedge.cli.daemon import find_daemon
    from zenedge.errors import Unavailable
    from zenedge.pool.recover import recover

    cfg = load_config()
    if find_daemon(cfg) is not None:   # it holds the old index open: it must not serve from it meanwhile
        raise Unavailable("a zenedge daemon is serving this pool", hint="stop it with `zenedge stop`, then recover")
    report = recover(paths.home(), cfg, say=(lambda line: None) if json_out else click.echo)
    if json_out:
        return print_json(report)
    click.echo(f"recovered {len(report['profiles'])} profiles ({', '.join(report['profiles']) or 'none'}) and "
               f"{len(report['bases'])} bases")
    if report["lost_and_found"]:
        click.echo(f"moved {len(report['lost_and_found'])} files nothing describes to "
                   f"{paths.home() / 'lost+found'}: {', '.join(report['lost_and_found'])}")
    for problem in report["problems"]:
        click.echo(f"problem: {problem}")
    if report["problems"]:
        raise click.exceptions.Exit(1)


@pool.command("maintain")
@json_option
def maintain_cmd(json_out: bool) -> None:
    """Reconcile, verify blobs, and bring the pool under the configured budget (compressing, then merging first)."""
    from zenedge.cli.backend import backend

    report = backend(load_config(), start=True).maintain()
    if json_out:
        return print_json(report)
    from zenedge.cli.progress import compressed

    click.echo(f"merged: {len(report['merged'])}, evicted: {', '.join(report['evicted']) or 'none'}, "
               f"removed (corrupt): {', '.join(report['removed_corrupt']) or 'none'}")
    if compressed(report.get("compressed", [])):
        click.echo(compressed(report["compressed"]))
    for problem in report["problems"]:
        click.echo(f"problem: {problem}")


@pool.command("gc")
@json_option
def gc_cmd(json_out: bool) -> None:
    """Remove leftovers (temporary files, unreferenced blobs, partial downloads no pull owns) and report them."""
    load_config()
    counts = open_store().reconcile(blocking=True)
    if json_out:
        return print_json(counts)
    click.echo(", ".join(f"{k}: {v}" for k, v in counts.items()) or "nothing to collect")
