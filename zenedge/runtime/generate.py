"""Generation: greedy or sampled decoding of a batch of requests (prompts as token ids: prompts.py)
whose rows may use different variants, streamed step by step with incremental detokenisation and
stop strings.

Each request's prompt is prefilled alone, in chunks of PREFILL_CHUNK tokens counted from its own
start, and one forward serves every decoding row's next token. A request gets the same tokens
alone as in any batch (decode.py). The loop runs in ticks: a decode step for the rows that are
decoding, then up to PREFILL_CHUNK prompt tokens of the rows still prefilling (fewest left first),
so a long prompt takes one chunk per tick while the other rows keep getting tokens, and a row that
joins mid-batch (`admit`, the daemon's scheduler) starts at the next tick. Finished rows free their
slot. The model calls and the KV cache live in decode.py; this module owns the request semantics.

A request must fit the base's context (ResidentModel.context_length): a prompt that leaves no room
is refused before anything is allocated (`check_fits`, ContextLengthExceeded), and generation stops
at the context's end with finish reason "length" (as when max_tokens is reached).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from zenedge.errors import ContextLengthExceeded, InvalidInput
from zenedge.runtime.decode import Stepper, open_stepper
from zenedge.runtime.grammar import GrammarState, closing_window
from zenedge.runtime.layers import RowVariants
from zenedge.runtime.model import ResidentModel
from zenedge.runtime.sampling import Sampler, SamplingParams, TokenLogprob
from zenedge.runtime.variants import Variant


# Prompt tokens per prefill forward. A chunk's cost is roughly linear in its tokens on a CPU, so a
# smaller one lets other rows decode more often during a long prefill for little loss; the chunks
# are counted from the row's own start, so they are the same alone as in a batch.
PREFILL_CHUNK = 256


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
    finish_reason: str | None = None   # "stop" (eos, stop string, grammar complete) | "length" | "error"
    error: str | None = None           # with "error": one line saying why the row ended
    logprob: TokenLogprob | None = None   # with SamplingParams.logprobs, for a token of the text


def check_fits(resident: ResidentModel, input_ids: Sequence[int]) -> None:
    """Refuse a prompt before any work: an empty one, or one that leaves no room to generate in
    the base's context. (A max_tokens beyond the room left is honoured up to the context's end,
    finish reason "length", as llama.cpp's server does; OpenAI refuses it.) Every entry point
    checks here: the engine, the daemon's scheduler per job, and generate() itself."""
    prompt, context = len(input_ids), resident.context_length
    if not prompt:
        raise InvalidInput("empty prompt")
    if prompt >= context:
        raise ContextLengthExceeded(
            f"the prompt is {prompt:,} tokens and {resident.name}'s context length is {context:,} tokens: "
            f"no room left for an answer", hint="shorten the prompt or the conversation")


class _Row:
    """Per-row decoding state: prefill progress, sampling, detokenisation, stop handling."""

    def __init__(self, index: int, request: GenerationRequest, tokenizer, eos_ids: tuple[int, ...], context: int):
        self.index = index
        self.prompt = list(request.input_ids)
        self.variant = request.variant
        self.params = request.params
        self.cancelled = request.cancelled
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_ids)
        self.limit = min(self.params.max_tokens, context - len(self.prompt))   # the context bounds it
        self.prefilled = 0        # prompt tokens already in the cache
        self.passed_over = False  # a tick's prefill budget ran out before this row's chunk
        self.pending: int | None = None   # the token the next decode step feeds
        self.ids: list[int] = []
        self.emitted = 0          # characters of the decoded text already streamed
        self.done = False
        self.sampler = Sampler(self.params)
        self.grammar: GrammarState | None = None   # started at the first choice (it needs the logits' width)
        self.hold = max((len(s) for s in self.params.stop), default=1) - 1

    @property
    def prefilling(self) -> bool:
        return not self.done and self.prefilled < len(self.prompt)

    @property
    def decoding(self) -> bool:
        return not self.done and self.pending is not None

    def next_chunk(self) -> list[int]:
        return self.prompt[self.prefilled:self.prefilled + PREFILL_CHUNK]

    @property
    def plain_greedy(self) -> bool:
        """Its token is the argmax of its logits as they come (the loop takes those in one call)."""
        return self.sampler.plain_greedy and self.params.grammar is None

    def choose(self, logits: torch.Tensor) -> int | None:
        """The next token, or None when the row's grammar admits none."""
        if self.params.grammar is not None:
            if self.grammar is None:
                width = max(logits.shape[-1], len(self.tokenizer))   # the head may be padded, or short
                self.grammar = self.params.grammar.start(self.tokenizer, width, tuple(sorted(self.eos_ids)))
            closing = len(self.ids) >= self.limit - closing_window(self.limit)   # end the JSON in time
            logits = self.grammar.mask(logits, closing)
            if logits is None:
                return None
        return self.sampler.choose(logits, self.prompt, self.ids)

    def take(self, token: int | None, logits: torch.Tensor) -> Delta:
        """The row's next token, chosen from `logits`: its delta, and the token the next step feeds
        (None when done)."""
        delta = self.advance(token)
        self.pending = None if self.done else token
        if self.params.logprobs is not None and delta.token_id is not None and token not in self.eos_ids:
            delta.logprob = TokenLogprob.of(logits, token, self.params.logprobs)
        return delta

    def advance(self, token: int | None) -> Delta:
        if token in self.eos_ids:
            self.done = True
            return Delta(self.index, self._flush(self._text()), token, "stop")
        if token is None or (self.grammar is not None and not self.grammar.take(token)):
            self.done = True                           # its grammar admits no token: this row ends
            return Delta(self.index, self._flush(self._text()), None, "error", self.grammar.error())
        self.ids.append(token)
        text = self._text()
        for stop in self.params.stop:
            position = text.find(stop, max(0, self.emitted - len(stop)))
            if position != -1:
                self.done = True
                return Delta(self.index, self._flush(text[:position]), token, "stop")
        if len(self.ids) >= self.limit:
            self.done = True
            return Delta(self.index, self._flush(text), token, "length")
        if self.grammar is not None and self.grammar.complete:   # nothing may follow but EOS
            self.done = True
            return Delta(self.index, self._flush(text), token, "stop")
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


def generate(resident: ResidentModel, requests: Sequence[GenerationRequest], *, stepper: str = "auto",
             admit: Callable[[], Sequence[GenerationRequest]] | None = None) -> Iterator[list[Delta]]:
    """Decode a batch; yield, per tick, the deltas of the rows that produced one (Delta.index: the
    request's place, in `requests` then in the order `admit` handed them over). Closing the
    iterator stops generation (a client that goes away costs nothing more).

    `admit`: called between ticks, returns requests that join the batch now (checked with
    `check_fits` by the caller: one that does not fit fails the whole batch here). Ignored by
    steppers whose rows are fixed (CUDA graphs).
    `stepper`: "auto" (the static cache, CUDA-graphed on a GPU, when the model allows it), or one
    of decode.STEPPERS forced ("dynamic" is transformers' own cache: the reference path)."""
    if not requests:
        return
    for request in requests:
        check_fits(resident, request.input_ids)        # before anything is allocated
    rows = _Rows(resident, requests)
    with open_stepper(resident, rows.batch(), max(len(r.input_ids) for r in requests),
                      max(row.limit for row in rows.slots), stepper) as model:
        rows.model = model
        while True:
            deltas = rows.tick()
            if deltas:
                yield deltas
            if admit is not None and model.joins:
                for request in admit():
                    check_fits(resident, request.input_ids)
                    rows.join(request)
            if rows.finished():
                return
            rows.resize()


class _Rows:
    """The rows of one generate() call in their slots of the stepper's batch."""

    def __init__(self, resident: ResidentModel, requests: Sequence[GenerationRequest]):
        self.resident = resident
        # what a finished slot feeds while the others decode (never read back); a tokenizer may name no pad
        self.pad = resident.tokenizer.pad_token_id if resident.tokenizer.pad_token_id is not None else 0
        self.count = 0                                     # requests seen: the next one's index
        self.slots: list[_Row] = [self._row(r) for r in requests]
        self.fresh: list[int] = []                         # slots given a new request since the last resize
        self.shape = self._shape(self._variants())         # what the stepper was last told
        self.model: Stepper | None = None

    def _row(self, request: GenerationRequest) -> _Row:
        row = _Row(self.count, request, self.resident.tokenizer, self.resident.eos_ids, self.resident.context_length)
        self.count += 1
        return row

    def _variants(self) -> list:
        """The variant each slot's decode row applies: its own while its request runs; a finished
        slot takes a running row's, so that a batch of one variant stays one (no mixed path)."""
        running = [row.variant for row in self.slots if not row.done]
        filler = running[0] if running else None
        return [row.variant if not row.done else filler for row in self.slots]

    @staticmethod
    def _shape(variants: list) -> list:
        return [None if variant is None else variant.key for variant in variants]

    def batch(self) -> RowVariants:
        return RowVariants.build(self._variants(), self.resident.device)

    def finished(self) -> bool:
        return all(row.done for row in self.slots)

    def join(self, request: GenerationRequest) -> None:
        """A request joins: it takes a finished row's slot, or a new one at the end."""
        row = self._row(request)
        slot = next((i for i, old in enumerate(self.slots) if old.done), len(self.slots))
        self.slots[slot:slot + 1] = [row]
        self.fresh.append(slot)

    def resize(self) -> None:
        """Tell the stepper when its rows changed: joins, finished rows at the end dropped, finished
        rows' variants swapped. Steppers with fixed rows keep theirs."""
        if not self.model.joins:
            return
        while len(self.slots) > 1 and self.slots[-1].done:    # (a fresh slot's row is running)
            self.slots.pop()
        variants = self._variants()
        shape = self._shape(variants)
        if shape != self.shape or self.fresh:
            self.model.set_batch(RowVariants.build(variants, self.resident.device), self.fresh)
            self.shape, self.fresh = shape, []

    def tick(self) -> list[Delta]:
        deltas = [Delta(row.index, "", None, "cancelled") for row in self.slots if self._cancel(row)]
        return deltas + self._step() + self._prefill()

    @staticmethod
    def _cancel(row: _Row) -> bool:
        if row.done or row.cancelled is None or not row.cancelled.is_set():
            return False
        row.done = True
        return True

    def _step(self) -> list[Delta]:
        """One decode step for every decoding row (one argmax and one host sync for all greedy rows)."""
        live = [row.decoding for row in self.slots]
        if not any(live):
            return []
        logits = self.model.step([row.pending if on else self.pad for row, on in zip(self.slots, live)], live)
        greedy = None
        if any(on and row.plain_greedy for row, on in zip(self.slots, live)):
            greedy = logits.argmax(dim=-1).tolist()
        return [row.take(greedy[slot] if row.plain_greedy else row.choose(logits[slot]), logits[slot])
                for slot, (row, on) in enumerate(zip(self.slots, live)) if on]

    def _prefill(self) -> list[Delta]:
        """Up to PREFILL_CHUNK prompt tokens (at least one chunk), rows with the fewest left first
        (a short prompt is not held up behind a long one), except that rows passed over in the last
        tick go first, the oldest request first (a stream of short prompts never starves a long
        one: it takes a chunk at least every other tick). A row whose prompt is in gets its first
        token."""
        def order(slot: int):
            row = self.slots[slot]
            return (not row.passed_over, row.index if row.passed_over else len(row.prompt) - row.prefilled)

        waiting = sorted((slot for slot, row in enumerate(self.slots) if row.prefilling), key=order)
        deltas, spent = [], 0
        for slot in waiting:
            row = self.slots[slot]
            chunk = row.next_chunk()
            row.passed_over = bool(spent) and spent + len(chunk) > PREFILL_CHUNK
            if row.passed_over:
                continue
            logits = self.model.prefill(slot, chunk)
            spent += len(chunk)
            row.prefilled += len(chunk)
            if not row.prefilling:
                deltas.append(row.take(row.choose(logits), logits))
        return deltas
