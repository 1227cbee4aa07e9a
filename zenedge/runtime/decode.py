"""Model stepping for generation: each request's prompt prefilled alone, in chunks, then one
forward per token for all rows at once, returning last logits.

`generate()` (generate.py) owns request semantics (sampling, stop strings, streaming, when each
row prefills and decodes); a stepper owns the model calls and the KV cache. Every row has its own
length: its prompt is written from position 0 by forwards of that row alone (`prefill`, one chunk
of at most generate.PREFILL_CHUNK tokens per call), and `step` feeds one token to every row, each at
its own next position. So a request's tokens never depend on the other rows (alone or batched, the
same sums: static_cache.py, lean_llama.py, layers.py), and a long prompt's chunks can alternate
with the other rows' decode steps. The steppers share one interface:

- `StaticStepper` (default): the pre-allocated `StaticKVCache`, reused across requests; nothing
  allocated or concatenated per token except the model's own activations. Rows may join between
  steps (`set_batch`).
- `FixedShapeStepper`: the static cache in fixed-shape mode (whole buffers, each row's length and
  mask kept on the device); `GraphedStepper` (CUDA only) captures its decode step once per
  request in a CUDA graph and replays it for every later token. The rows are fixed.
- `DynamicStepper`: transformers' own cache, one per row, every forward one row alone. The
  reference the others are tested against, and the fallback for attention layouts the static
  cache does not model (sliding windows, hybrid layers, kernels that ignore 4-D masks).

The static-cache steppers run Llama-architecture models through `lean_llama.LeanLlama` (the same
math on the model's own modules, without transformers' per-module overhead) and every other model
through `model(...)`. `lean_llama.set_enabled(resident.model, False)` forces `model(...)` (tests,
benchmarks); the DynamicStepper always uses `model(...)`.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import torch

from zenedge.kernels import native
from zenedge.runtime import c_step, lean_llama
from zenedge.runtime.backbone import cache_argument
from zenedge.runtime.layers import RowVariants
from zenedge.runtime.model import ResidentModel

log = logging.getLogger("zenedge.runtime")

# The decode step is captured only when the request is long enough to repay the capture.
GRAPH_MIN_TOKENS = 8
# A views-mode cache starts with room for this many new tokens and doubles when a request needs
# more: max_tokens may be 65536, and reserving that per row up front would waste gigabytes.
INITIAL_NEW_TOKENS = 256


class Stepper(Protocol):
    joins: bool    # whether set_batch may change the rows

    def prefill(self, row: int, input_ids: Sequence[int]) -> torch.Tensor:
        """The next chunk of row `row`'s prompt, after what it holds → logits [V] at its last token."""

    def step(self, next_ids: Sequence[int], live: Sequence[bool]) -> torch.Tensor:
        """One token per row → logits [n, V]; rows not `live` (finished, still prefilling) feed a
        pad, do not advance, and their logits mean nothing."""

    def set_batch(self, batch: RowVariants, fresh: Sequence[int] = ()) -> None:
        """The rows are now `batch`'s (rows may be added or dropped at the end); rows in `fresh`
        start new requests, empty."""


def static_cache_supported(model) -> bool:
    """True when every attention layer is full causal attention fed through `cache.update` and
    honouring a 4-D additive mask (sdpa / eager): what `StaticKVCache` models exactly."""
    config = model.config
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return False
    if getattr(config, "is_encoder_decoder", False):
        return False
    if any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or ())):
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    return True


class _Forward:
    """model(...), or its lean equivalent where there is one (`lean`), with the rows' variants
    applied, returning last logits: a row's prefill chunk alone, or a decode step of all rows."""

    def __init__(self, resident: ResidentModel, batch: RowVariants, lean: bool = True):
        self.model = resident.model
        self.state = resident.state
        self.device = resident.device
        self.batch = batch
        self.cache_kw = cache_argument(resident.model)
        self.lean = lean_llama.lean_forward(resident.model, batch) if lean else None

    def prefill(self, row: int, input_ids, positions, mask, cache) -> torch.Tensor:
        # input_ids, positions: [1, T]; mask: [1, 1, T, L] → logits [1, V]; the plain weights
        alone = RowVariants.build([self.batch.rows[row]], self.device)
        with self.state.applied(alone, plain=True):
            if self.lean is not None:
                return self.lean.prefill(input_ids, positions, mask, cache)
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                             use_cache=True, logits_to_keep=1, **{self.cache_kw: cache})
        return out.logits[:, -1, :]

    def step(self, input_ids, view, cache) -> torch.Tensor:
        # input_ids: [n]; view: the cache's StepView → logits [n, V]
        with self.state.applied(self.batch):
            if self.lean is not None:
                return self.lean.step(input_ids, view)
            out = self.model(input_ids=input_ids[:, None], attention_mask=view.mask,
                             position_ids=view.positions[:, None], use_cache=True, logits_to_keep=1,
                             **{self.cache_kw: cache})
        return out.logits[:, -1, :]


class DynamicStepper:
    """transformers' DynamicCache, one per row, each forward one row alone: the reference semantics."""

    joins = True

    def __init__(self, resident: ResidentModel, batch: RowVariants):
        self.resident = resident
        self.cache_kw = cache_argument(resident.model)
        self.variants: list = []
        self.caches: list = []
        self.lengths: list[int] = []
        self.set_batch(batch, range(len(batch.rows)))

    def set_batch(self, batch: RowVariants, fresh: Sequence[int] = ()) -> None:
        rows = len(batch.rows)
        self.variants = list(batch.rows)
        self.caches = (self.caches + [None] * rows)[:rows]
        self.lengths = (self.lengths + [0] * rows)[:rows]
        for row in fresh:
            self.caches[row], self.lengths[row] = None, 0

    @torch.inference_mode()
    def prefill(self, row, input_ids):
        return self._run(row, torch.tensor([list(input_ids)]), plain=True)

    @torch.inference_mode()
    def step(self, next_ids, live):
        out = {row: self._run(row, torch.tensor([[next_ids[row]]])) for row, advance in enumerate(live) if advance}
        logits = torch.zeros((len(next_ids), next(iter(out.values())).shape[-1]), device=self.resident.device)
        for row, row_logits in out.items():
            logits[row] = row_logits
        return logits

    def _run(self, row: int, input_ids: torch.Tensor, plain: bool = False) -> torch.Tensor:
        resident, start, width = self.resident, self.lengths[row], input_ids.shape[1]
        mask = torch.ones((1, start + width), dtype=torch.long, device=resident.device)
        positions = torch.arange(start, start + width, device=resident.device)[None]
        with resident.state.applied(RowVariants.build([self.variants[row]], resident.device), plain=plain):
            out = resident.model(input_ids=input_ids.to(resident.device), attention_mask=mask, position_ids=positions,
                                 use_cache=True, logits_to_keep=1, **{self.cache_kw: self.caches[row]})
        self.caches[row] = getattr(out, self.cache_kw)
        self.lengths[row] += width
        return out.logits[0, -1, :]


class StaticStepper:
    """The pre-allocated cache, written in place, every row at its own length."""

    joins = True

    def __init__(self, resident: ResidentModel, batch: RowVariants, cache):
        self.resident = resident
        self.device = resident.device
        self.cache = cache
        self.forward = _Forward(resident, batch)

    def set_batch(self, batch: RowVariants, fresh: Sequence[int] = ()) -> None:
        cache, rows = self.cache, len(batch.rows)
        cache.reserve(rows, cache.capacity)
        cache.resize(rows)
        for row in fresh:
            cache.reset_row(row)
        self.forward = _Forward(self.resident, batch)

    @torch.inference_mode()
    def prefill(self, row, input_ids):
        cache = self.cache
        start, width = cache.lengths[row], len(input_ids)
        cache.reserve(cache.batch, start + width)                              # doubles: rare
        chunk, mask = cache.chunk(row, width)
        ids = torch.tensor([list(input_ids)], device=self.device)                  # [1, T]
        positions = torch.arange(start, start + width, device=self.device)[None]   # [1, T]
        logits = self.forward.prefill(row, ids, positions, mask, chunk)
        cache.advance_row(row, width)
        return logits[0]

    @torch.inference_mode()
    def step(self, next_ids, live):
        cache = self.cache
        needed = 1 + max((length for length, advance in zip(cache.lengths, live) if advance), default=0)
        if needed > cache.capacity:
            cache.reserve(cache.batch, needed)                                   # doubles: rare
        ids = torch.tensor(list(next_ids), device=self.device)                    # [n]
        logits = self.forward.step(ids, cache.step_view(), cache)
        cache.end_step(live)
        return logits


class FixedShapeStepper(StaticStepper):
    """Every decode step has the same shapes and tensor addresses: the cache returns whole buffers,
    each row's length lives on the device and advances there, the mask is opened on the device,
    and the input ids and live flags are copied into static tensors. Eager here (and testable on
    CPU); what the CUDA graph below captures. The rows are fixed for the request."""

    joins = False

    def __init__(self, resident: ResidentModel, batch: RowVariants, cache):
        if not cache.full_views:
            raise ValueError("a fixed-shape stepper needs a full-views cache")
        super().__init__(resident, batch, cache)
        rows = len(batch.rows)
        self.ids = torch.zeros(rows, dtype=torch.long, device=self.device)      # static inputs
        self.live = torch.zeros(rows, dtype=torch.long, device=self.device)

    def set_batch(self, batch, fresh=()):
        raise RuntimeError("a fixed-shape stepper's rows are fixed for the request")

    def _body(self) -> torch.Tensor:
        """Everything one token does on the device, host-sync free."""
        cache = self.cache
        logits = self.forward.step(self.ids, cache.step_view(), cache)
        cache.advance_on_device(self.live)
        return logits

    @torch.inference_mode()
    def step(self, next_ids, live):
        cache = self.cache
        if any(length + 1 > cache.capacity for length, advance in zip(cache.lengths, live) if advance):
            raise RuntimeError("a fixed-shape cache is sized for the whole request up front")
        self.ids.copy_(torch.tensor(list(next_ids)), non_blocking=True)
        self.live.copy_(torch.tensor([int(bool(a)) for a in live]), non_blocking=True)
        logits = self._run_body()
        cache.end_step(live)                   # host mirror of `written` (the device moved that)
        return logits

    def _run_body(self) -> torch.Tensor:
        return self._body()


class GraphedStepper(FixedShapeStepper):
    """GPU ONLY. The fixed-shape decode step captured in a CUDA graph. The first step runs eagerly
    on a side stream (it warms up autotuners, workspaces and allocators, as capture requires), the
    second is captured and replayed, and every later step is one replay. Any failure to capture
    falls back to eager steps for the rest of the request. The graph lives for one request: it
    bakes in this batch's variants, rows and cache buffers."""

    def __init__(self, resident: ResidentModel, batch: RowVariants, cache):
        if resident.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA resident")
        super().__init__(resident, batch, cache)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = False
        self.steps = 0

    def _run_body(self) -> torch.Tensor:
        self.steps += 1
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        if self.failed or self.steps == 1:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                logits = self._body()
            torch.cuda.current_stream().wait_stream(stream)
            return logits
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):      # records only: nothing runs until replay
                self.logits = self._body()
        except Exception as exc:               # an op that cannot be captured: stay eager
            log.warning("CUDA graph capture failed, decoding eagerly: %s", exc)
            self.failed = True
            torch.cuda.synchronize()
            return self._body()
        self.graph = graph
        graph.replay()
        return self.logits


STEPPERS = ("auto", "dynamic", "static", "fixed", "graphed")


@contextmanager
def open_stepper(resident: ResidentModel, batch: RowVariants, width: int, max_new: int,
                 kind: str = "auto") -> Iterator[Stepper]:
    """A stepper with its cache checked out, for `batch`'s rows with prompts of up to `width`
    tokens and up to `max_new` new ones. "auto": the fastest one that serves this model exactly
    (graphed on CUDA for requests long enough to repay the capture, else static; dynamic for
    attention layouts the static cache does not model). The others force one, for tests and
    benchmarks."""
    if kind not in STEPPERS:
        raise ValueError(f"stepper must be one of {', '.join(STEPPERS)}, got {kind!r}")
    if kind == "auto":
        kind = auto_stepper(resident.model, resident.device, resident.graphs, max_new)
    if kind == "dynamic":
        yield DynamicStepper(resident, batch)
        return
    rows, pool = len(batch.rows), resident.kv_pool
    if kind in ("fixed", "graphed"):
        # Fixed shapes: the whole request fits up front (capacity rounds up, so requests reuse it).
        with pool.acquire(rows, width + max_new, full_views=True) as cache:
            yield (GraphedStepper if kind == "graphed" else FixedShapeStepper)(resident, batch, cache)
        return
    with pool.acquire(rows, width + min(max_new, INITIAL_NEW_TOKENS)) as cache:
        yield StaticStepper(resident, batch, cache)


def auto_stepper(model, device: torch.device, graphs: bool, max_new: int) -> str:
    """The stepper `open_stepper(kind="auto")` opens for a request of `max_new` new tokens."""
    kind = "static" if static_cache_supported(model) else "dynamic"
    if kind == "static" and device.type == "cuda" and graphs and max_new >= GRAPH_MIN_TOKENS:
        kind = "graphed"
    return kind


@dataclass(frozen=True)
class DecodePath:
    """How a base's requests decode (what `doctor` and /api/ps report), decided by the functions
    the decode loop itself calls, so the report says what runs."""

    stepper: str                # "static", "dynamic", or "graphed" (CUDA, GRAPH_MIN_TOKENS or more new tokens)
    forward: str                # "lean" (lean_llama) or "transformers" (model(...))
    weights: str                # the CPU matmul weight format (cpu_weights.py); "full" on CUDA
    native_kernels: bool        # zenedge's C kernels for the CPU are loaded (kernels/native/)
    native_kernels_off: str | None = None   # why they are not
    native_isa: str | None = None           # the instruction set they are built for (kernels/native isa())
    native_isa_why: str | None = None       # why that one
    lean_refused: str | None = None         # why the forward is not the lean one
    c_step_fallback: str | None = None      # why the latest decode batch ran the Python step, not the C step


def decode_path(model, device: torch.device, weights: str, graphs: bool = True) -> DecodePath:
    """The decode path of `model` (a resident's, or a `model.skeleton`) on `device` with `weights`."""
    stepper = auto_stepper(model, device, graphs, GRAPH_MIN_TOKENS)
    if stepper == "dynamic":   # DynamicStepper never asks for the lean forward
        refused = "the dynamic stepper (an attention layout the static cache does not model) runs transformers' forward"
    else:
        refused = lean_llama.refusal(model)
    isa, why = native.in_use() if device.type == "cpu" else (None, f"the model is on {device.type}, not the CPU")
    on = isa is not None
    return DecodePath(stepper, "transformers" if refused else "lean", weights, on, None if on else why,
                      isa, why if on else None, refused, c_step.c_step_fallback(model))
