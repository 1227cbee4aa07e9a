"""Generation: chat-templated prompts, greedy or sampled decoding of a batch of requests whose rows
may use different variants, streamed step by step with incremental detokenisation and stop strings.

One forward pass serves the whole batch (left-padded, explicit position ids); rows that finish keep
a slot until the batch ends, their outputs ignored. The model calls and the KV cache live in
decode.py (a static, pre-allocated cache by default); this module owns the request semantics.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from zenedge.errors import InvalidInput
from zenedge.runtime.decode import left_pad, open_stepper
from zenedge.runtime.layers import RowVariants
from zenedge.runtime.model import ResidentModel
from zenedge.runtime.variants import Variant


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0       # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        if not 1 <= self.max_tokens <= 1 << 16:
            raise InvalidInput(f"max_tokens must be between 1 and 65536, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidInput(f"temperature must be between 0 and 100, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidInput(f"top_p must be in (0, 1], got {self.top_p}")
        if len(self.stop) > 16 or any(not s or len(s) > 256 for s in self.stop):
            raise InvalidInput("stop: at most 16 non-empty strings of at most 256 characters")


@dataclass
class GenerationRequest:
    input_ids: list[int]
    variant: Variant | None
    params: SamplingParams = field(default_factory=SamplingParams)
    cancelled: threading.Event | None = None   # set by a server when its client goes away


@dataclass
class Delta:
    """What one row produced in one step."""

    index: int
    text: str
    token_id: int | None
    finish_reason: str | None = None   # "stop" (eos or stop string) | "length"


def encode_chat(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Messages in OpenAI form → token ids through the base's own chat template."""
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in {"system", "user", "assistant"} \
                or not isinstance(message.get("content"), str):
            raise InvalidInput("each message needs a role (system, user, assistant) and string content")
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def encode_text(tokenizer, prompt: str) -> list[int]:
    """A raw completion prompt (no chat template)."""
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


class _Row:
    """Per-row decoding state: sampling, detokenisation, stop handling."""

    def __init__(self, index: int, request: GenerationRequest, tokenizer, eos_ids: tuple[int, ...],
                 device: torch.device):
        self.index = index
        self.params = request.params
        self.cancelled = request.cancelled
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_ids)
        self.ids: list[int] = []
        self.emitted = 0          # characters of the decoded text already streamed
        self.done = False
        self.generator = None
        if self.params.temperature > 0:
            self.generator = torch.Generator(device="cpu")
            self.generator.manual_seed(self.params.seed if self.params.seed is not None
                                       else int(torch.randint(0, 2**62, (1,)).item()))
        self.hold = max((len(s) for s in self.params.stop), default=1) - 1

    def choose(self, logits: torch.Tensor) -> int:
        # logits: [V] fp32 for this row's last position
        if self.generator is None:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float().cpu() / self.params.temperature, dim=-1)
        if self.params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, 0) - sorted_probs < self.params.top_p  # always keeps the top token
            sorted_probs = sorted_probs * keep
            return int(order[torch.multinomial(sorted_probs, 1, generator=self.generator)])
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def advance(self, token: int) -> Delta:
        if token in self.eos_ids:
            self.done = True
            return Delta(self.index, self._flush(self._text()), token, "stop")
        self.ids.append(token)
        text = self._text()
        for stop in self.params.stop:
            position = text.find(stop, max(0, self.emitted - len(stop)))
            if position != -1:
                self.done = True
                return Delta(self.index, self._flush(text[:position]), token, "stop")
        if len(self.ids) >= self.params.max_tokens:
            self.done = True
            return Delta(self.index, self._flush(text), token, "length")
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the rest
            return Delta(self.index, "", token)
        safe = max(self.emitted, len(text) - self.hold)  # hold back a possible stop-string prefix
        out, self.emitted = text[self.emitted:safe], safe
        return Delta(self.index, out, token)

    def _text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def _flush(self, text: str) -> str:
        out = text[self.emitted:]
        self.emitted = len(text)
        return out


def generate(resident: ResidentModel, requests: Sequence[GenerationRequest], *,
             stepper: str = "auto") -> Iterator[list[Delta]]:
    """Decode a batch; yield, per step, the deltas of the rows still running. Closing the
    iterator stops generation (a client that goes away costs nothing more).

    `stepper`: "auto" (the static cache, CUDA-graphed on a GPU, when the model allows it), or one
    of decode.STEPPERS forced ("dynamic" is transformers' own cache: the reference path)."""
    if not requests:
        return
    for request in requests:
        if not request.input_ids:
            raise InvalidInput("empty prompt")
    tokenizer = resident.tokenizer
    rows = [_Row(i, r, tokenizer, resident.eos_ids, resident.device) for i, r in enumerate(requests)]
    pad = tokenizer.pad_token_id
    input_ids, valid = left_pad([r.input_ids for r in requests], pad)
    batch = RowVariants.build([r.variant for r in requests], resident.device)
    max_new = max(r.params.max_tokens for r in requests)
    with open_stepper(resident, batch, input_ids.shape[1], max_new, stepper) as model_steps:
        logits = model_steps.prefill(input_ids, valid)                        # [B, V]
        while True:
            deltas, next_ids = _advance(rows, logits, pad)
            yield deltas
            if all(row.done for row in rows):
                return
            logits = model_steps.step(next_ids)


def _advance(rows: list[_Row], logits: torch.Tensor, pad: int) -> tuple[list[Delta], list[int]]:
    """Pick each running row's token (one argmax and one host sync for all greedy rows), update
    its text, and return the step's deltas and the next input ids (pads for finished rows)."""
    greedy = None
    if any(not row.done and row.generator is None for row in rows):
        greedy = logits.argmax(dim=-1).tolist()
    deltas, next_ids = [], []
    for row in rows:
        if not row.done and row.cancelled is not None and row.cancelled.is_set():
            row.done = True
            deltas.append(Delta(row.index, "", None, "cancelled"))
        if row.done:
            next_ids.append(pad)
            continue
        token = greedy[row.index] if row.generator is None else row.choose(logits[row.index])
        delta = row.advance(token)
        deltas.append(delta)
        next_ids.append(delta.token_id if not row.done else pad)
    return deltas, next_ids
