"""`zenedge compress`: a full fine-tune → a 1-bit BitDelta variant admitted into the pool.

The fine-tune is compressed against a registered base into packed signs + per-row scales
(bitdelta/compressor.py), optionally distilled (the scales trained against the fine-tune's
logits), then imported like any .bitdelta file (admission.py: the budget, merging, eviction)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from zenedge.bases import DEFAULT_BASE, ensure_base
from zenedge.config import Config
from zenedge.names import check_name
from zenedge.pool.admission import import_bitdelta
from zenedge.store import Store

Say = Callable[[str], None]


def compress_finetune(store: Store, cfg: Config, finetuned: Path, name: str, *, base: str = DEFAULT_BASE,
                      distill: bool = False, steps: int = 50, eval_path: Path | None = None,
                      output: Path | None = None, progress: Say | None = None,
                      base_progress: Say | None = None) -> dict[str, Any]:
    """Compress `finetuned` against `base` and store it as `name`. `output`: also keep the
    .bitdelta file there. `progress`: a line every 10% and the distillation's result;
    `base_progress`: the default base's first-use set-up. Returns the compression summary and
    the admission result in one dict."""
    from zenedge.bitdelta import compress_model

    check_name(name, "profile name")
    base_row = ensure_base(store, base, progress=base_progress)
    base_dir = store.home / base_row["dir"]
    with tempfile.TemporaryDirectory(dir=store.blobs.tmp) as work:
        path = Path(work) / f"{name}.bitdelta"
        report = compress_model(base_dir, finetuned, path, progress=_every_tenth(progress),
                                base_sha256=base_row["sha256"])
        summary: dict[str, Any] = {"modules": report.modules_compressed, "bytes_full": report.bytes_full_delta,
                                   "bytes_bits": report.bytes_bitdelta, "ratio": report.ratio,
                                   "mean_relative_error": report.mean_relative_error}
        if distill:
            summary["distillation"] = _distill(base_dir, finetuned, path, steps, progress)
        if output is not None:
            shutil.copyfile(path, output)
        result = import_bitdelta(store, cfg, path, name, base=base_row["name"], eval_path=eval_path,
                                 origin={"source": "compress", "finetuned": str(Path(finetuned).resolve())})
    summary.update(result.as_dict())
    return summary


def _every_tenth(say: Say | None) -> Callable[[int, int, str], None]:
    last = [-1]

    def progress(done: int, total: int, tensor: str) -> None:
        percent = 100 * done // total
        if say is not None and percent >= last[0] + 10:
            last[0] = percent
            say(f"compressing {percent}% ({tensor})")

    return progress


def _distill(base_dir: Path, finetuned: Path, path: Path, steps: int, say: Say | None) -> dict[str, float]:
    """Train the scales against the fine-tune's logits on calibration text; rewrite the file."""
    import torch
    from transformers import AutoTokenizer

    from zenedge.bitdelta import (build_calibration_batches, distill_scales, load_bitdelta, save_bitdelta,
                                  stdlib_texts, with_alphas)
    from zenedge.runtime.model import load_causal_lm

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = load_causal_lm(base_dir, dtype=torch.float32)
    tuned = load_causal_lm(finetuned, dtype=torch.float32)
    batches = build_calibration_batches(stdlib_texts(), tokenizer, max_batches=32)
    data = load_bitdelta(path)
    result = distill_scales(base, tuned, data, batches, steps)
    save_bitdelta(path, with_alphas(data, result.alphas))
    if say is not None:
        say(f"distillation: logit MSE {result.loss_before:.4f} → {result.loss_after:.4f}")
    return {"loss_before": result.loss_before, "loss_after": result.loss_after}
