"""Calibration text for scale distillation, from what is on the machine (no downloads).

The paper distils on C4; offline we use any generic text: by default the Python standard
library's own sources and docstrings, which every machine running zenedge has.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch


def stdlib_texts(limit: int = 64, min_chars: int = 2000) -> list[str]:
    """Up to ``limit`` Python stdlib source files (sorted by path, so the set is reproducible)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(text) >= min_chars:
            texts.append(text)
        if len(texts) >= limit:
            break
    return texts


def build_calibration_batches(texts: list[str], tokenizer, *, seq_len: int = 128, batch_size: int = 4,
                              max_batches: int | None = None) -> list[torch.Tensor]:
    """Tokenise ``texts`` as one stream, cut it into [batch_size, seq_len] input_ids batches.

    ``tokenizer`` is any callable returning {"input_ids": [...]} for a string (HF tokenizers do).
    The tail that does not fill a whole batch is dropped.
    """
    stream: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    for text in texts:
        stream.extend(tokenizer(text)["input_ids"])
        if eos is not None:
            stream.append(eos)
        if max_batches is not None and len(stream) >= max_batches * batch_size * seq_len:
            break
    per_batch = batch_size * seq_len
    count = len(stream) // per_batch
    if max_batches is not None:
        count = min(count, max_batches)
    ids = torch.tensor(stream[: count * per_batch], dtype=torch.long)
    return list(ids.view(count, batch_size, seq_len)) if count else []
