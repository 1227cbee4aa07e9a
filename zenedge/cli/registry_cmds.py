"""`zenedge search`, `zenedge pull`, `zenedge registry build|serve`."""

from __future__ import annotations

from pathlib import Path

import click

from zenedge.cli.context import load_config, open_store
from zenedge.cli.output import json_option, print_json, print_table
from zenedge.cli.progress import PoolProgress, echo_outcome
from zenedge.sizes import format_size


@click.command("search")
@click.argument("text", required=False, default="")
@json_option
def search(text: str, json_out: bool) -> None:
    """Profiles the registries offer (name, kind, size, description)."""
    from zenedge.registry.resolve import search as do_search

    rows = do_search(load_config(), text)
    if json_out:
        return print_json(rows)
    print_table([(r["name"], r["version"], r["kind"], format_size(r["bytes"]), r["description"]) for r in rows],
                ["NAME", "VERSION", "KIND", "SIZE", "DESCRIPTION"], empty="no profiles match")


@click.command("pull")
@click.argument("reference")
@json_option
def pull(reference: str, json_out: bool) -> None:
    """Download a profile (NAME or NAME:VERSION) into the pool, verified and resumable."""
    from zenedge.cli.backend import backend

    pool = backend(load_config(), start=True)   # a daemon's resident base gates a merge: no second load here
    if json_out:
        return print_json(pool.pull(reference))
    with PoolProgress() as display:
        result = pool.pull(reference, display.update)
    note = " (already up to date)" if result["up_to_date"] else ""
    echo_outcome(f"pulled {result['name']} {result['version']} ({result['kind']}, {format_size(result['bytes'])}){note}",
                 result)


@click.group("registry")
def registry() -> None:
    """Build or serve a registry folder (the layout of profiles/)."""


@registry.command("build")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--anchors", is_flag=True,
              help="First measure each LoRA profile's eval set on the base and on its adapter (anchors.json), "
                   "so pulls that merge it skip that work.")
@json_option
def build(directory: Path, anchors: bool, json_out: bool) -> None:
    """Write index.json and a manifest.json per profile folder in DIRECTORY."""
    from zenedge.registry.builder import build_registry

    if anchors:
        from zenedge.pool.publish import measure_registry_anchors

        measure_registry_anchors(open_store(), load_config(), directory, progress=None if json_out else click.echo)
    manifests = build_registry(directory, progress=None if json_out else click.echo)
    if json_out:
        return print_json([m.to_json() for m in manifests])
    click.echo(f"wrote {directory / 'index.json'} with {len(manifests)} profiles")


@registry.command("serve")
@click.argument("directory", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--port", type=int, default=8080, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Use 0.0.0.0 to share on a LAN.")
def serve(directory: Path, port: int, host: str) -> None:
    """Serve a registry folder over HTTP (with Range support, so pulls resume)."""
    from zenedge.registry.serve import make_server

    server = make_server(directory, host, port)
    click.echo(f"serving {directory} on http://{host}:{server.server_address[1]} (registry.urls = "
               f"[\"http://{host}:{server.server_address[1]}\"])")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
