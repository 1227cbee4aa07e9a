"""Greedy exact match: the fraction of an eval set a model answers word for word, for the
benchmarks and the profiles' recipes (the pool's gate scores teacher-forced: evaluation.py).

Model-agnostic like evaluation.py (any causal LM whose forward is `model(input_ids, attention_mask)
.logits`, no KV cache, no `generate`): each step reruns the full right-padded sequences. The
runtime's own decode loop (generate.py) is the fast path where a resident model serves.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from zenedge.evaluation import EncodedExample, EvalSetError
from zenedge.runtime.backbone import right_padded


def _pad_id(tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0


@torch.no_grad()
def greedy_completions(
    model, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_id: int | None,
    pad_id: int = 0, batch_size: int = 8,
    keep_going: Callable[[int, list[int]], bool] | None = None,
) -> list[list[int]]:
    """Greedy-decode each prompt (argmax, no sampling); stops at stop_id, which is not returned.

    Each step reruns the full right-padded sequences of the rows still running and reads the
    logits at each row's last real token. Quadratic in length, but exact for any causal LM and
    cheap at eval-set sizes (short prompts, short answers).
    `keep_going(index, generated_ids)`, when given, may stop a row early (returns False).
    """
    results: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(prompts), batch_size):
        rows = list(range(start, min(start + batch_size, len(prompts))))
        seqs = {i: list(prompts[i]) for i in rows}
        running = list(rows)
        for _ in range(max_new_tokens):
            if not running:
                break
            input_ids, attention_mask = right_padded([seqs[i] for i in running], pad_id)
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
            last = attention_mask.sum(dim=1) - 1  # [B]
            next_ids = logits[torch.arange(len(running)), last].argmax(dim=-1).tolist()
            still = []
            for i, tok in zip(running, next_ids):
                if tok == stop_id:
                    continue
                seqs[i].append(tok)
                results[i].append(tok)
                if keep_going is None or keep_going(i, results[i]):
                    still.append(i)
            running = still
    return results


def normalize_whitespace(text: str) -> str:
    return " ".join(text.split())


@torch.no_grad()
def exact_match(
    model, tokenizer, encoded: Sequence[EncodedExample], max_new_tokens: int | None = None,
    batch_size: int = 8,
) -> float:
    """Fraction of greedy completions equal to the reference answer, whitespace-normalised.

    max_new_tokens defaults, per set, to the longest reference answer plus a margin of 8 tokens:
    a completion that has not stopped by then cannot be equal to its reference anyway.
    """
    if not encoded:
        raise EvalSetError("no examples to score")
    budget = max_new_tokens or max(len(e.answer_ids) for e in encoded) + 8
    references = [normalize_whitespace(e.answer) for e in encoded]

    def still_possible(i: int, ids: list[int]) -> bool:
        # normalize(a + b) always starts with normalize(a), so once the normalised text so far
        # is not a prefix of the reference, no continuation can match: stop decoding that row.
        # (A trailing U+FFFD is half of a multi-byte character: wait for the rest.)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        return text.endswith("\ufffd") or references[i].startswith(normalize_whitespace(text))

    completions = greedy_completions(
        model, [e.prompt_ids for e in encoded], budget, encoded[0].stop_id,
        pad_id=_pad_id(tokenizer), batch_size=batch_size, keep_going=still_possible,
    )
    hits = 0
    for reference, ids in zip(references, completions):
        hits += normalize_whitespace(tokenizer.decode(ids, skip_special_tokens=True)) == reference
    return hits / len(encoded)
