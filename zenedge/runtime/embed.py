"""Embeddings from the resident base: the mean of the last hidden state over a text's real tokens,
L2-normalised, with a profile's variant applied (so a profile embeds text the way it reads it).

Texts are right-padded into micro-batches. In a causal model a real token never attends to the pads
that follow it, and the mean skips them, so a text's vector does not depend on what it is batched
with (up to float rounding in the matmuls). The forward is backbone.py's, the one teacher-forced
scoring reads text through: the decoder stack only (no LM head: a vocabulary's logits per token
would cost more than the layers) with the plain weights; the int8/int4 copies are for decode steps.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from zenedge.errors import InvalidInput
from zenedge.runtime import threads
from zenedge.runtime.backbone import hidden_states, right_padded
from zenedge.runtime.model import ResidentModel
from zenedge.runtime.prompts import encode_text
from zenedge.runtime.variants import Variant


@dataclass(frozen=True)
class EmbeddingLimits:
    max_tokens: int = 2048      # per text, lowered to the base's context length
    batch_tokens: int = 8192    # padded tokens per forward: bounds activation memory


@dataclass
class Embedded:
    vectors: torch.Tensor       # [N, D] fp32, unit rows
    token_counts: list[int]     # tokens embedded per text (after truncation)
    load_ns: int                # spent loading the base and the variant (0 when both were resident)


def context_length(resident: ResidentModel) -> int:
    return int(getattr(resident.model.config, "max_position_embeddings", 0) or EmbeddingLimits.max_tokens)


def tokenize(resident: ResidentModel, texts: Sequence[str], max_tokens: int, truncate: bool) -> list[list[int]]:
    """Token ids per text (no chat template, no special tokens). An empty text has no mean: refused.
    Longer than `max_tokens`: cut at the end (`truncate`) or refused."""
    out = []
    for index, text in enumerate(texts):
        ids = encode_text(resident.tokenizer, text)
        if not ids:
            raise InvalidInput(f"input {index} is empty: there is nothing to embed")
        if len(ids) > max_tokens:
            if not truncate:
                raise InvalidInput(f"input {index} has {len(ids)} tokens; the limit is {max_tokens}",
                                   hint="shorten it, or let the server truncate it (Ollama's truncate: true)")
            ids = ids[:max_tokens]
        out.append(ids)
    return out


def micro_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped shortest first, each group's rows × longest row ≤ batch_tokens (a text longer
    than that alone gets a group of its own)."""
    groups: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        group = groups[-1] if groups else None
        if group is not None and (len(group) + 1) * lengths[index] <= batch_tokens:
            group.append(index)
        else:
            groups.append([index])
    return groups


def embed_ids(resident: ResidentModel, variant: Variant | None, ids: Sequence[Sequence[int]],
              batch_tokens: int = EmbeddingLimits.batch_tokens) -> torch.Tensor:
    """Unit vectors [N, hidden] for token-id lists, through `resident`'s backbone with `variant`
    (micro-batches on lanes: threads.map_lanes)."""
    out = torch.empty((len(ids), resident.model.config.hidden_size), dtype=torch.float32)
    pad = resident.tokenizer.pad_token_id or 0

    def run(group: list[int]) -> None:
        input_ids, mask = (t.to(resident.device) for t in right_padded([ids[i] for i in group], pad))
        with torch.inference_mode(), resident.state.using([variant] * len(group), plain=True):  # per thread
            states = hidden_states(resident.model, input_ids, mask)               # [B, W, hidden]
            weights = mask.unsqueeze(-1).to(torch.float32)                        # [B, W, 1]
            mean = (states.float() * weights).sum(dim=1) / weights.sum(dim=1)     # [B, hidden]
            vectors = F.normalize(mean, dim=-1).cpu()
        out[group] = vectors

    threads.map_lanes(run, micro_batches([len(i) for i in ids], batch_tokens))
    return out


def keep_dimensions(vectors: torch.Tensor, dimensions: int | None) -> torch.Tensor:
    """The first `dimensions` (≤ the width) components, re-normalised: what Ollama's and OpenAI's
    `dimensions` do."""
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    return F.normalize(vectors[:, :dimensions], dim=-1)


class Embedder:
    """The daemon's embeddings for a route: its base, its variant (through the delta cache), limits.

    One embedding batch runs at a time (a lock): requests queue here rather than multiplying
    activation memory. It shares the model with the scheduler's generation thread the way the
    pool's quality gate does: the variant selection is per thread (layers.VariantState), and
    inference never writes the model."""

    def __init__(self, engine, limits: EmbeddingLimits = EmbeddingLimits()):
        self.engine = engine
        self.limits = limits
        self._lock = threading.Lock()

    def embed(self, route, texts: Sequence[str], *, truncate: bool = False,
              dimensions: int | None = None) -> Embedded:
        started = time.perf_counter_ns()
        resident = self.engine.resident(route.base)
        variant = self.engine.variant(route)
        load_ns = time.perf_counter_ns() - started
        width = resident.model.config.hidden_size
        if dimensions is not None and dimensions > width:
            raise InvalidInput(f"dimensions must be at most {width} for {route.name!r}, got {dimensions}")
        ids = tokenize(resident, texts, min(self.limits.max_tokens, context_length(resident)), truncate)
        with self._lock, self.engine.router.inflight(route):
            vectors = embed_ids(resident, variant, ids, self.limits.batch_tokens)
        self.engine.record_request(route)      # counted as a generation is
        return Embedded(keep_dimensions(vectors, dimensions), [len(i) for i in ids], load_ns)
