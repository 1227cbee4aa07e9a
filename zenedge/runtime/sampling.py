"""Choosing a row's next token from its logits: greedy or sampled, with the filters and penalties
the OpenAI and Ollama APIs name.

The order is Ollama's and llama.cpp's: penalties on the raw logits, then top-k, temperature,
softmax, top-p and min-p. The penalties:
- `repeat_penalty` (llama.cpp's, Ollama's option): a token among the last `repeat_last_n` tokens
  of the prompt and the answer has its logit divided by it when positive, multiplied when not.
- `presence_penalty` and `frequency_penalty` (OpenAI's): subtracted from the logit of a token the
  answer already holds, once and once per occurrence.
Greedy decoding (temperature 0) takes the argmax of the penalised logits. Everything here reads
one row's logits and history only, so a row chooses the same token alone as in any batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from zenedge.errors import InvalidInput
from zenedge.runtime.grammar import Grammar


MAX_TOP_LOGPROBS = 20   # OpenAI's limit


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's log-probability under the model (its logits as they come: before the
    penalties, the temperature and any grammar), and the `top` likeliest tokens', likeliest first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @classmethod
    def of(cls, logits: torch.Tensor, token: int, top: int) -> "TokenLogprob":
        """logits: [V], the head's whole width (the distribution the token was drawn from)."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        best = torch.topk(logprobs, top) if top else None
        ranked = () if best is None else tuple(zip(best.indices.tolist(), best.values.tolist()))
        return cls(token, float(logprobs[token]), ranked)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0       # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int = 0                 # 0 = off
    min_p: float = 0.0             # 0 = off
    repeat_penalty: float = 1.0    # 1 = off
    repeat_last_n: int = 64        # -1 = the whole context, 0 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    grammar: Grammar | None = None   # the output held to it (structured output, tool calls)
    logprobs: int | None = None      # None: off; k: each token's log-probability and the k likeliest

    def __post_init__(self):
        if not 1 <= self.max_tokens <= 1 << 16:
            raise InvalidInput(f"max_tokens must be between 1 and 65536, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidInput(f"temperature must be between 0 and 100, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidInput(f"top_p must be in (0, 1], got {self.top_p}")
        if len(self.stop) > 16 or any(not s or len(s) > 256 for s in self.stop):
            raise InvalidInput("stop: at most 16 non-empty strings of at most 256 characters")
        if self.top_k < 0:
            raise InvalidInput(f"top_k must be 0 (off) or more, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidInput(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0.0 < self.repeat_penalty <= 100.0:
            raise InvalidInput(f"repeat_penalty must be in (0, 100], got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise InvalidInput(f"repeat_last_n must be -1 (the whole context), 0 (off) or more, got {self.repeat_last_n}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidInput(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidInput(f"{name} must be between -2 and 2, got {getattr(self, name)}")

    @property
    def penalised(self) -> bool:
        return ((self.repeat_penalty != 1.0 and self.repeat_last_n != 0)
                or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)


class Sampler:
    """One row's token choice. `plain_greedy`: its choice is the argmax of the logits as they are,
    which the decode loop takes for all such rows in one call."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.generator = None
        if params.temperature > 0:
            self.generator = torch.Generator(device="cpu")
            self.generator.manual_seed(params.seed if params.seed is not None
                                       else int(torch.randint(0, 2**62, (1,)).item()))

    @property
    def plain_greedy(self) -> bool:
        return self.generator is None and not self.params.penalised

    def choose(self, logits: torch.Tensor, prompt: Sequence[int], answer: Sequence[int]) -> int:
        """logits: [V] for the row's last position; prompt and answer: its token ids so far."""
        if self.plain_greedy:
            return int(torch.argmax(logits))
        logits = logits.float().cpu()
        if self.params.penalised:
            logits = self._penalise(logits, prompt, answer)
        if self.generator is None:
            return int(torch.argmax(logits))
        p = self.params
        if 0 < p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits / p.temperature, dim=-1)
        if p.top_p == 1.0 and p.min_p == 0.0:
            return int(torch.multinomial(probs, 1, generator=self.generator))
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.ones_like(sorted_probs, dtype=torch.bool)   # the top token is always kept
        if p.top_p < 1.0:
            keep &= torch.cumsum(sorted_probs, 0) - sorted_probs < p.top_p
        if p.min_p > 0.0:
            keep &= sorted_probs >= p.min_p * sorted_probs[0]
        return int(order[torch.multinomial(sorted_probs * keep, 1, generator=self.generator)])

    def _penalise(self, logits: torch.Tensor, prompt: Sequence[int], answer: Sequence[int]) -> torch.Tensor:
        p, vocab = self.params, logits.numel()
        logits = logits.clone()
        if p.repeat_penalty != 1.0 and p.repeat_last_n != 0:
            history = [*prompt, *answer]
            window = history if p.repeat_last_n == -1 else history[-p.repeat_last_n:]
            seen = torch.tensor(sorted({t for t in window if t < vocab}), dtype=torch.long)
            chosen = logits[seen]
            logits[seen] = torch.where(chosen > 0, chosen / p.repeat_penalty, chosen * p.repeat_penalty)
        if (p.presence_penalty or p.frequency_penalty) and answer:
            counts = torch.bincount(torch.tensor(answer, dtype=torch.long), minlength=vocab)[:vocab].float()
            logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
        return logits
