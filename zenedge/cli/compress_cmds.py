"""`zenedge compress`: a full fine-tune → a 1-bit BitDelta variant in the pool."""

from __future__ import annotations

from pathlib import Path

import click

from zenedge.cli.context import load_config
from zenedge.cli.output import json_option, print_json
from zenedge.sizes import format_size


@click.command("compress")
@click.option("--base", "base_name", default="smollm2-135m", show_default=True, help="Registered base name.")
@click.option("--finetuned", type=click.Path(path_type=Path, exists=True, file_okay=False), required=True,
              help="Hugging Face directory of the full fine-tune (safetensors).")
@click.option("--name", "-n", required=True, help="Profile name for the compressed variant.")
@click.option("--distill", is_flag=True, help="Train the scales against the fine-tune's logits (CPU: minutes).")
@click.option("--steps", type=int, default=50, show_default=True, help="Distillation steps.")
@click.option("--eval", "eval_set", type=click.Path(path_type=Path), default=None, help="Eval set for the gate.")
@click.option("--output", type=click.Path(path_type=Path), default=None,
              help="Also keep the .bitdelta file here (it is always stored in the pool).")
@json_option
def compress(base_name: str, finetuned: Path, name: str, distill: bool, steps: int, eval_set: Path | None,
             output: Path | None, json_out: bool) -> None:
    """Compress FINETUNED against BASE into packed signs + per-row scales, and store it."""
    from zenedge.cli.backend import backend

    pool = backend(load_config(), start=True)
    summary = pool.compress(finetuned, name, base=base_name, distill=distill, steps=steps, eval_path=eval_set,
                            output=output, progress=None if json_out else _to_stderr)
    if json_out:
        return print_json(summary)
    click.echo(f"stored {name} (bitdelta, {format_size(summary['bytes'])}; full delta "
               f"{format_size(summary.get('bytes_full', 0))}, ratio {summary.get('ratio', 0):.1f}×)")


def _to_stderr(event: dict) -> None:
    click.echo(event["status"], err=True)
