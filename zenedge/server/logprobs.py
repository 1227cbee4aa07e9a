"""Token log-probabilities in the wires' shapes: each token named by its text and its bytes, as
OpenAI's chat (`logprobs.content`), its legacy completions (`tokens`, `text_offset`, …) and
Ollama's `logprobs` (the chat shape) send them."""

from __future__ import annotations

from zenedge.api import wire
from zenedge.errors import InvalidInput
from zenedge.runtime.grammar import token_bytes
from zenedge.runtime.sampling import TokenLogprob


def logprobs_asked(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """SamplingParams.logprobs for a request's `logprobs` and `top_logprobs`: None (off), or how
    many alternatives to list."""
    if not logprobs:
        if top_logprobs:
            raise InvalidInput("`top_logprobs` needs `logprobs: true`")
        return None
    return top_logprobs or 0


class LogprobText:
    """One choice's token log-probabilities in the wire's shapes, each token by its text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.offset = 0   # characters of the choice's tokens so far (the legacy text_offset)

    def _entry(self, token: int, logprob: float) -> wire.TopLogprob:
        raw = token_bytes(self.tokenizer, token)
        return wire.TopLogprob(token=raw.decode("utf-8", "replace"), logprob=logprob, bytes=list(raw))

    def chat(self, items: list[TokenLogprob]) -> wire.ChoiceLogprobs:
        content = [wire.TokenLogprobs(**self._entry(item.token, item.logprob).model_dump(),
                                      top_logprobs=[self._entry(t, lp) for t, lp in item.top]) for item in items]
        return wire.ChoiceLogprobs(content=content)

    def completion(self, items: list[TokenLogprob]) -> wire.CompletionLogprobs:
        tokens, offsets = [], []
        for item in items:
            offsets.append(self.offset)
            tokens.append(self._entry(item.token, item.logprob).token)
            self.offset += len(tokens[-1])
        top = [{self._entry(t, lp).token: lp for t, lp in item.top} for item in items]
        return wire.CompletionLogprobs(tokens=tokens, token_logprobs=[item.logprob for item in items],
                                       top_logprobs=top, text_offset=offsets)
