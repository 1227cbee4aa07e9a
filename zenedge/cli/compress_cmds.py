"""`zenedge compress`: a full fine-tune → a 1-bit BitDelta variant in the pool."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from zenedge.cli.context import load_config, open_store
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
    from zenedge import bases, policy
    from zenedge.bitdelta import compress_model
    from zenedge.names import check_name

    check_name(name, "profile name")
    cfg = load_config()
    store = open_store()
    base = bases.ensure_base(store, base_name, progress=lambda m: click.echo(m, err=True))
    base_dir = store.home / base["dir"]
    with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as work:
        path = Path(work) / f"{name}.bitdelta"
        last = [-1]

        def progress(done: int, total: int, tensor: str) -> None:
            percent = 100 * done // total
            if not json_out and percent >= last[0] + 10:
                last[0] = percent
                click.echo(f"compressing {percent}% ({tensor})", err=True)

        report = compress_model(base_dir, finetuned, path, progress=progress, base_sha256=base["sha256"])
        summary = {"modules": report.modules_compressed, "bytes_full": report.bytes_full_delta,
                   "bytes_bits": report.bytes_bitdelta, "ratio": report.ratio,
                   "mean_relative_error": report.mean_relative_error}
        if distill:
            summary["distillation"] = _distill(base_dir, finetuned, path, steps, json_out)
        if output is not None:
            import shutil

            shutil.copyfile(path, output)
        result = policy.import_bitdelta(store, cfg, path, name, base=base["name"], eval_path=eval_set,
                                        origin={"source": "compress", "finetuned": str(finetuned.resolve())})
    summary.update(result)
    if json_out:
        return print_json(summary)
    click.echo(f"stored {name} (bitdelta, {format_size(result['bytes'])}; full delta "
               f"{format_size(summary.get('bytes_full', 0))}, ratio {summary.get('ratio', 0):.1f}×)")


def _distill(base_dir: Path, finetuned: Path, path: Path, steps: int, quiet: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zenedge.bitdelta import build_calibration_batches, distill_scales, load_bitdelta, save_bitdelta, stdlib_texts
    from zenedge.bitdelta import with_alphas

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    tuned = AutoModelForCausalLM.from_pretrained(finetuned, dtype=torch.float32)
    batches = build_calibration_batches(stdlib_texts(), tokenizer, max_batches=32)
    data = load_bitdelta(path)
    result = distill_scales(base, tuned, data, batches, steps)
    save_bitdelta(path, with_alphas(data, result.alphas))
    if not quiet:
        click.echo(f"distillation: logit MSE {result.loss_before:.4f} → {result.loss_after:.4f}", err=True)
    return {"loss_before": result.loss_before, "loss_after": result.loss_after}
