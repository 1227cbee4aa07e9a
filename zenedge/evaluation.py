"""Score a causal LM on a profile's eval set: teacher-forced answer loss and answer tokens right.

Model-agnostic on purpose: the pool's quality gate runs it on a base with a LoRA applied, on a
merged adapter, on a BitDelta model. All it needs is a causal LM whose forward is
`model(input_ids=[B, T], attention_mask=[B, T]).logits -> [B, T, V]` and a Hugging Face tokenizer
with a chat template. No `generate`, no PEFT: every forward is a plain full-sequence call with
right padding, which is exact for any causal model (left padding would shift position ids unless
the model derives them from the mask, and not every model does). Greedy exact match, for the
benchmarks and recipes, is bench/exact_match.py.

An eval set is JSONL, one chat pair per line: {"prompt": str, "answer": str, "system"?: str}.
The prompt is the user turn, the answer the assistant turn; scores only look at the answer
tokens (plus the template's end-of-turn token, so a model that does not stop is penalised).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

from zenedge.errors import InvalidInput
from zenedge.runtime.backbone import KeysValues, hidden_states, right_padded
from zenedge.runtime.prompts import chat_ids


class EvalSetError(InvalidInput):
    """An eval set file or example is malformed (the message names the file and line)."""

    code = "invalid_eval_set"


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    system: str | None = None


@dataclass(frozen=True)
class EncodedExample:
    prompt_ids: tuple[int, ...]  # chat-templated user turn + assistant header
    answer_ids: tuple[int, ...]  # answer tokens + end-of-turn token (possibly truncated)
    answer: str  # the reference text, for exact match
    stop_id: int | None  # token that ends the assistant turn, if the template has one


_KEYS = {"prompt", "answer", "system"}


def parse_example(obj: object, where: str = "example") -> Example:
    """Validate one decoded JSON object as an Example; errors say where and what."""
    if not isinstance(obj, dict):
        raise EvalSetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - _KEYS
    if unknown:
        raise EvalSetError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(_KEYS)})")
    for key in ("prompt", "answer"):
        if key not in obj:
            raise EvalSetError(f"{where}: missing key {key!r}")
        if not isinstance(obj[key], str) or not obj[key].strip():
            raise EvalSetError(f"{where}: {key!r} must be a non-empty string")
    system = obj.get("system")
    if system is not None and not isinstance(system, str):
        raise EvalSetError(f"{where}: 'system' must be a string when present")
    return Example(prompt=obj["prompt"], answer=obj["answer"], system=system)


def load_eval_set(path: str | Path) -> list[Example]:
    """Read a JSONL eval set; blank lines are skipped, anything else must be a valid example."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvalSetError(f"{path}: cannot read eval set ({exc.strerror or exc})") from exc
    examples = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalSetError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from exc
        examples.append(parse_example(obj, where=f"{path}:{lineno}"))
    if not examples:
        raise EvalSetError(f"{path}: eval set is empty")
    return examples


def _messages(example: Example) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": example.system}] if example.system else []
    messages.append({"role": "user", "content": example.prompt})
    return messages


def end_of_turn_id(tokenizer) -> int | None:
    """The token that closes an assistant turn: the tokenizer's eos (e.g. <|im_end|>)."""
    return tokenizer.eos_token_id


def encode_example(tokenizer, example: Example, max_len: int) -> EncodedExample:
    """Template the pair and split it into prompt ids and answer ids.

    The answer ids are the tokens the template renders for the assistant turn, cut after the
    end-of-turn token (templates add a trailing newline we do not want to score). Rendering
    the whole conversation, instead of tokenizing the answer alone, keeps the tokenization at
    the prompt/answer boundary identical to what the model sees in training.
    """
    messages = _messages(example)
    prompt_ids = chat_ids(tokenizer, messages)
    # Stripped: leading whitespace would merge with the template's newline into one token (and
    # break the prefix), and exact match ignores surrounding whitespace anyway.
    answer = {"role": "assistant", "content": example.answer.strip()}
    full_ids = chat_ids(tokenizer, messages + [answer], add_generation_prompt=False)
    if full_ids[: len(prompt_ids)] != prompt_ids:
        raise EvalSetError(
            "chat template is not prefix-stable: the rendered prompt is not a prefix of the "
            "rendered conversation, so answer tokens cannot be located"
        )
    answer_ids = full_ids[len(prompt_ids):]
    stop_id = end_of_turn_id(tokenizer)
    if stop_id is not None and stop_id in answer_ids:
        answer_ids = answer_ids[: answer_ids.index(stop_id) + 1]
    if len(prompt_ids) >= max_len:
        raise EvalSetError(
            f"prompt of {len(prompt_ids)} tokens does not fit max_len={max_len}: "
            f"{example.prompt[:60]!r}"
        )
    # Long answers are cut to fit: the loss then covers their first tokens only. Exact match
    # still compares against the full reference text.
    answer_ids = answer_ids[: max_len - len(prompt_ids)]
    return EncodedExample(tuple(prompt_ids), tuple(answer_ids), example.answer, stop_id)


def encode_examples(tokenizer, examples: Iterable[Example], max_len: int) -> list[EncodedExample]:
    return [encode_example(tokenizer, ex, max_len) for ex in examples]


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # [B, T], right padded
    attention_mask: torch.Tensor  # [B, T], 1 on real tokens
    target_mask: torch.Tensor  # [B, T], 1 where the NEXT token (input_ids[:, t+1]) is scored
    skip: int = 0  # leading tokens all rows share, left out of input_ids (their keys/values: backbone.prefix_states)


def right_padded_batch(encoded: Sequence[EncodedExample], pad_id: int, skip: int = 0) -> Batch:
    """Stack prompt+answer sequences (after their first `skip` tokens), right padded; the mask
    marks answer-token predictions."""
    if any(skip >= len(e.prompt_ids) for e in encoded):
        raise ValueError(f"skip={skip} must leave every prompt's last token (it predicts the first answer token)")
    seqs = [(e.prompt_ids + e.answer_ids)[skip:] for e in encoded]
    input_ids, attention_mask = right_padded(seqs, pad_id)
    target_mask = torch.zeros(input_ids.shape, dtype=torch.bool)
    for row, (e, seq) in enumerate(zip(encoded, seqs)):
        # Position t predicts token t+1: answer tokens sit at [P, P+A), predicted from [P-1, P+A-1).
        target_mask[row, len(e.prompt_ids) - skip - 1 : len(seq) - 1] = True
    return Batch(input_ids, attention_mask, target_mask, skip)


def shared_prefix(encoded: Sequence[EncodedExample]) -> int:
    """How many leading tokens every example shares and a batch may skip (`right_padded_batch`):
    the chat template's system turn and user header."""
    return shared_length([e.prompt_ids for e in encoded])


def shared_length(rows: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every row shares, leaving each row at least its last token."""
    first = rows[0]
    length = min(len(row) for row in rows) - 1
    for row in rows[1:]:
        length = next((i for i in range(length) if row[i] != first[i]), length)
    return max(0, length)


# Causal LMs whose logits are exactly lm_head(last hidden state): for them the head (a [V, D]
# matmul, a large share of a small model's forward) runs on the scored positions only, in fp32.
# Others (logit soft-capping, scaled logits) go through their own forward.
_PLAIN_HEAD = {"llama", "mistral", "qwen2", "qwen3", "phi3"}


def supports_prefix(model) -> bool:
    """Whether `example_losses` can take a shared prefix's keys and values for this model (causal
    LMs whose logits are lm_head of the decoder's last hidden state and whose decoder takes a cache)."""
    return getattr(model.config, "model_type", None) in _PLAIN_HEAD and getattr(model, "model", None) is not None


def head_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits of hidden states [N, hidden] through a plain-head model's head (`supports_prefix`),
    in fp32 whatever the body ran in."""
    head = model.get_output_embeddings()
    with torch.autocast(hidden.device.type, enabled=False):
        if not getattr(head, "keeps_plain", True):     # only its quantized copy is resident
            return head.fast.linear(hidden.float(), head.bias).float()
        return F.linear(hidden.float(), head.weight.float(), None if head.bias is None else head.bias.float())


def _scored_logits(model, batch: Batch, prefix: Sequence[KeysValues] | None) -> torch.Tensor:
    """fp32 logits at the positions that predict answer tokens: [N_answer_tokens, V]."""
    mask = batch.target_mask[:, :-1]  # [B, T-1]
    if batch.skip and prefix is None:
        raise ValueError("a batch that skips a shared prefix needs that prefix's keys and values")
    if supports_prefix(model):
        hidden = hidden_states(model, batch.input_ids, batch.attention_mask, prefix if batch.skip else None)
        return head_logits(model, hidden[:, :-1][mask])
    if batch.skip:
        raise ValueError(f"{type(model).__name__}: a shared prefix needs a plain-head causal LM")
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return logits[:, :-1][mask].float()


@torch.no_grad()
def example_scores(model, batch: Batch, prefix: Sequence[KeysValues] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `batch`: the summed answer-token cross-entropy ([B], fp64; summed, not averaged,
    so that sets of examples combine token-weighted: a mean loss is Σ sums / Σ answer tokens) and
    how many answer tokens are the model's argmax ([B], int64: teacher-forced token accuracy).
    With `batch.skip`, `prefix` holds per row every layer's keys and values of the skipped tokens
    (backbone.prefix_states; rows of one variant may share one, rows of different variants have their own)."""
    mask = batch.target_mask[:, :-1]
    logits = _scored_logits(model, batch, prefix)
    targets = batch.input_ids[:, 1:][mask]
    losses = F.cross_entropy(logits, targets, reduction="none")
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(mask)[mask]
    sums = torch.zeros(mask.shape[0], dtype=torch.float64, device=mask.device).index_add_(0, rows, losses.double())
    hits = torch.zeros(mask.shape[0], dtype=torch.int64, device=mask.device).index_add_(
        0, rows, (logits.argmax(-1) == targets).long())
    return sums, hits


def example_losses(model, batch: Batch, prefix: Sequence[KeysValues] | None = None) -> torch.Tensor:
    """The summed answer-token cross-entropy of each row (`example_scores`' first half)."""
    return example_scores(model, batch, prefix)[0]


def answer_tokens(example: EncodedExample) -> int:
    return len(example.answer_ids)


@torch.no_grad()
def answer_loss(model, encoded: Sequence[EncodedExample], batch_size: int = 8, pad_id: int = 0) -> float:
    """Mean teacher-forced cross-entropy per answer token over the whole set (token-weighted)."""
    if not encoded:
        raise EvalSetError("no examples to score")
    total, count = 0.0, 0
    # Sorting by length keeps padding small; the result does not depend on the order.
    ordered = sorted(encoded, key=lambda e: len(e.prompt_ids) + len(e.answer_ids))
    for start in range(0, len(ordered), batch_size):
        chunk = ordered[start : start + batch_size]
        total += example_losses(model, right_padded_batch(chunk, pad_id)).sum().item()
        count += sum(answer_tokens(e) for e in chunk)
    return total / count
