"""`zenedge base list|add`: the base models variants apply to (stored apart from the budget)."""

from __future__ import annotations

from pathlib import Path

import click

from zenedge.cli.context import load_config, open_store
from zenedge.cli.output import json_option, print_json, print_table
from zenedge.sizes import format_size


@click.group("base")
def base() -> None:
    """List or register base models."""


@base.command("list")
@json_option
def list_(json_out: bool) -> None:
    """Registered bases (the default smollm2-135m appears after its first use)."""
    load_config()
    rows = [{"name": b["name"], "sha256": b["sha256"], "bytes": b["bytes"], "aliases": b["aliases"],
             "source": b["source"]} for b in open_store().bases()]
    if json_out:
        return print_json(rows)
    print_table([(r["name"], format_size(r["bytes"]), r["sha256"][:12], ", ".join(r["aliases"])) for r in rows],
                ["NAME", "SIZE", "SHA256", "ALIASES"],
                empty="no bases yet: the default smollm2-135m is set up on first use")


@base.command("add")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--name", "-n", default=None, help="Base name (default: from the path).")
@click.option("--alias", multiple=True, help="Other names adapters may use for it.")
@click.option("--convert", is_flag=True,
              help="GGUF: dequantize into fp32 safetensors instead of storing the file as it is "
                   "(what merged exports of its variants need).")
def add(path: Path, name: str | None, alias: tuple[str, ...], convert: bool) -> None:
    """Register a Hugging Face model directory or a GGUF file.

    A GGUF file of a llama, mistral or qwen2/3 model is stored as it is: its Q4_0, Q4_1, Q4_K and
    Q8_0 weights are what zenedge multiplies with, bit for bit; other tensor types are requantized
    to Q8_0 at load (the loss is reported here). Other architectures are converted to safetensors."""
    from zenedge import bases

    load_config()
    store = open_store()
    name = name or path.stem.lower()
    if path.suffix.lower() == ".gguf":
        row = bases.add_gguf(store, path, name, aliases=list(alias), progress=lambda m: click.echo(m, err=True),
                             keep_quantized=not convert)
    else:
        row = bases.add_hf_dir(store, path, name, aliases=list(alias))
    click.echo(f"added base {row['name']} ({format_size(row['bytes'])}, sha256 {row['sha256'][:12]})")
