"""Generation: chat-templated prompts, greedy or sampled decoding of a batch of requests whose rows
may use different variants, streamed step by step with incremental detokenisation and stop strings.

One forward pass serves the whole batch (left-padded, explicit position ids, transformers' KV
cache); rows that finish keep a slot until the batch ends, their outputs ignored.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from zenedge.errors import InvalidInput
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


def cache_argument(model) -> str:
    """The KV-cache keyword of this transformers version (`cache` since 5.x, `past_key_values` before)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


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


def generate(resident: ResidentModel, requests: Sequence[GenerationRequest]) -> Iterator[list[Delta]]:
    """Decode a batch; yield, per step, the deltas of the rows still running. Closing the
    iterator stops generation (a client that goes away costs nothing more)."""
    if not requests:
        return
    device, model, tokenizer = resident.device, resident.model, resident.tokenizer
    for request in requests:
        if not request.input_ids:
            raise InvalidInput("empty prompt")
    rows = [_Row(i, r, tokenizer, resident.eos_ids, device) for i, r in enumerate(requests)]
    pad = tokenizer.pad_token_id
    width = max(len(r.input_ids) for r in requests)
    # Left padding: every row's last prompt token sits in the last column.
    input_ids = torch.full((len(requests), width), pad, dtype=torch.long)
    mask = torch.zeros((len(requests), width), dtype=torch.long)
    for i, request in enumerate(requests):
        input_ids[i, width - len(request.input_ids):] = torch.tensor(request.input_ids)
        mask[i, width - len(request.input_ids):] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = None
    cache_kw = cache_argument(model)
    with torch.inference_mode(), resident.state.using([r.variant for r in requests]):
        step_ids = input_ids
        while True:
            out = model(input_ids=step_ids, attention_mask=mask, position_ids=positions,
                        use_cache=True, logits_to_keep=1, **{cache_kw: cache})
            cache = getattr(out, cache_kw)
            logits = out.logits[:, -1, :]  # [B, V]
            deltas, next_ids = [], []
            for row in rows:
                if not row.done and row.cancelled is not None and row.cancelled.is_set():
                    row.done = True
                    deltas.append(Delta(row.index, "", None, "cancelled"))
                if row.done:
                    next_ids.append(pad)
                    continue
                delta = row.advance(row.choose(logits[row.index]))
                deltas.append(delta)
                next_ids.append(delta.token_id if not row.done else pad)
            yield deltas
            if all(row.done for row in rows):
                return
            step_ids = torch.tensor(next_ids, device=device).unsqueeze(1)
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=device)], dim=1)
            positions = positions[:, -1:] + 1
