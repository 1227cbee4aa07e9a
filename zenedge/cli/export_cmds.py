"""`zenedge export DEST [NAMES…]`: PEFT directories (and merged models) for vLLM, LoRAX, Ray Serve."""

from __future__ import annotations

from pathlib import Path

import click

from zenedge.cli.context import load_config, open_store
from zenedge.cli.output import json_option, print_json, print_table


@click.command("export")
@click.argument("dest", type=click.Path(path_type=Path, file_okay=False))
@click.argument("names", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(["peft", "hf-merged"]), default="peft", show_default=True,
              help="peft: one PEFT adapter directory per LoRA/merged adapter (vLLM, LoRAX, Ray Serve); "
                   "hf-merged: every profile as a full merged model directory.")
@click.option("--bitdelta-as", type=click.Choice(["hf-merged", "lora"]), default="hf-merged", show_default=True,
              help="With --format peft: BitDelta variants as full merged weights, or as a LoRA approximation.")
@click.option("--rank", type=int, default=64, show_default=True, help="Rank of the BitDelta LoRA approximation.")
@json_option
def export(dest: Path, names: tuple[str, ...], fmt: str, bitdelta_as: str, rank: int, json_out: bool) -> None:
    """Export profiles (all by default) with a manifest saying how to serve them."""
    from zenedge.pool.export import MANIFEST, export as run

    load_config()
    manifest = run(open_store(), dest, list(names) or None, format=fmt, bitdelta_as=bitdelta_as, rank=rank)
    if json_out:
        return print_json(manifest)
    print_table([(e["dir"], e["format"], e["kind"], ", ".join(e["serves"]),
                  f"{e['relative_error']:.3f}" if "relative_error" in e else "") for e in manifest["adapters"]],
                ["DIR", "FORMAT", "KIND", "SERVES", "APPROX ERROR"])
    click.echo(f"manifest: {dest / MANIFEST}")
    if "vllm" in manifest["serve"]:
        click.echo(f"serve with: {manifest['serve']['vllm']}")
