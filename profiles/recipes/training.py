"""The training loop shared by the LoRA and the full fine-tune recipes.

Loss = mean cross-entropy over answer tokens only (prompt and chat-template tokens are
context), computed with the same encoding and masking as `zenedge.evaluation`, so what we
train is exactly what the eval set scores. Batches are right padded; examples are visited in
a seeded random order, reshuffled every epoch. AdamW, linear warmup, then linear decay to 10%.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from zenedge.evaluation import (
    Batch, EncodedExample, EvalSetError, Example, encode_example, right_padded_batch,
)


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    lr: float
    max_len: int
    seed: int = 0
    warmup: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    log_every: int = 10
    bf16: bool = True  # autocast matmuls to bf16: AMX/AVX512-BF16 CPUs run them several times faster


@dataclass
class TrainResult:
    seconds_per_step: float  # mean wall time of steps after the first two (warm-up of kernels)
    final_loss: float  # mean training loss of the last 10% of steps (at least 5)
    n_train: int  # encoded examples available (after dropping ones that do not fit)
    losses: list[float] = field(default_factory=list)


def encode_for_training(tokenizer, examples: Iterable[dict], max_len: int) -> list[EncodedExample]:
    """Encode chat pairs; a pair whose prompt does not fit max_len is dropped (answers are cut)."""
    encoded = []
    for obj in examples:
        try:
            encoded.append(encode_example(tokenizer, Example(**obj), max_len))
        except EvalSetError:
            continue
    return encoded


def _lr_factor(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 1.0 - 0.9 * progress


def _batches(encoded: list[EncodedExample], cfg: TrainConfig):
    rng = random.Random(cfg.seed)
    order: list[int] = []
    while True:
        if len(order) < cfg.batch_size:
            epoch = list(range(len(encoded)))
            rng.shuffle(epoch)
            order.extend(epoch)
        picked, order = order[: cfg.batch_size], order[cfg.batch_size :]
        yield [encoded[i] for i in picked]


def _answer_loss(model, batch: Batch) -> torch.Tensor:
    """Mean answer-token cross-entropy, projecting to the vocabulary only where it is needed.

    Why: the lm_head (49k x 576) is a fifth of the model's FLOPs, and most positions are prompt.
    `logits_to_keep` (transformers' causal LMs) takes the positions to project; we keep the
    span that covers every row's answer and score exactly the masked tokens inside it.
    """
    scored = batch.target_mask.any(dim=0).nonzero().flatten()
    lo, hi = scored.min().item(), scored.max().item() + 1
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   logits_to_keep=torch.arange(lo, hi)).logits  # [B, hi-lo, V]
    targets = batch.input_ids[:, lo + 1 : hi + 1]
    mask = batch.target_mask[:, lo:hi]
    return F.cross_entropy(logits[mask].float(), targets[mask])


def train(
    model: torch.nn.Module, params: list[torch.nn.Parameter], encoded: list[EncodedExample],
    cfg: TrainConfig, pad_id: int, log: Callable[[str], None] = print,
) -> TrainResult:
    """Run cfg.steps optimizer steps on `params` (the only ones with requires_grad)."""
    if len(encoded) < cfg.batch_size:
        raise ValueError(f"only {len(encoded)} training examples for batch size {cfg.batch_size}")
    torch.manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, cfg))
    model.train()
    losses, step_times = [], []
    batches = _batches(encoded, cfg)
    for step in range(cfg.steps):
        start = time.perf_counter()
        batch = right_padded_batch(next(batches), pad_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss = _answer_loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step_times.append(time.perf_counter() - start)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"loss is {losses[-1]} at step {step}")
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            recent = losses[-cfg.log_every :]
            log(f"step {step + 1}/{cfg.steps} loss {sum(recent) / len(recent):.4f} "
                f"lr {scheduler.get_last_lr()[0]:.2e} {step_times[-1]:.2f}s/step")
    model.eval()
    timed = step_times[2:] or step_times
    tail = losses[-max(5, cfg.steps // 10) :]
    return TrainResult(sum(timed) / len(timed), sum(tail) / len(tail), len(encoded), losses)
