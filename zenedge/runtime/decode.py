"""Model stepping for generation: a prefill, then one forward per token, returning last logits.

`generate()` (generate.py) owns request semantics (sampling, stop strings, streaming); a stepper
owns the model calls and the KV cache. The steppers share one interface:

- `StaticStepper` (default): the pre-allocated `StaticKVCache`, reused across requests; ready-made
  4-D masks; nothing allocated or concatenated per token except the model's own activations.
- `FixedShapeStepper`: the static cache in fixed-shape mode (whole buffers, a mask opened on the
  device); `GraphedStepper` (CUDA only) captures its decode step once per request in a CUDA
  graph and replays it for every later token.
- `DynamicStepper`: transformers' own cache and a growing 2-D mask. The reference the others are
  tested against, and the fallback for attention layouts the static cache does not model
  (sliding windows, hybrid layers, kernels that ignore 4-D masks).

The static-cache steppers run Llama-architecture models through `lean_llama.LeanLlama` (the same
math on the model's own modules, without transformers' per-module overhead) and every other model
through `model(...)`. `lean_llama.set_enabled(resident.model, False)` forces `model(...)` (tests,
benchmarks); the DynamicStepper always uses `model(...)`.
"""

from __future__ import annotations

import inspect
import logging
from contextlib import contextmanager
from typing import Iterator, Protocol, Sequence

import torch

from zenedge.runtime import lean_llama
from zenedge.runtime.layers import RowVariants
from zenedge.runtime.model import ResidentModel

log = logging.getLogger("zenedge.runtime")

# The decode step is captured only when the request is long enough to repay the capture.
GRAPH_MIN_TOKENS = 8
# A views-mode cache starts with room for this many new tokens and doubles when a request needs
# more: max_tokens may be 65536, and reserving that per row up front would waste gigabytes.
INITIAL_NEW_TOKENS = 256


class Stepper(Protocol):
    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """input_ids, valid: [B, W] left-padded prompt → logits [B, V] at each row's last token."""

    def step(self, next_ids: Sequence[int]) -> torch.Tensor:
        """One new token per row (finished rows feed a pad) → logits [B, V]."""


def cache_argument(model) -> str:
    """The KV-cache keyword of this transformers version (`cache` since 5.x, `past_key_values` before)."""
    keyword = getattr(model, "_zenedge_cache_kw", None)
    if keyword is None:
        keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        model._zenedge_cache_kw = keyword   # looked up once per model: signature() costs ~50 µs
    return keyword


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


def left_pad(requests_ids: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts → (input_ids [B, W], valid [B, W] bool), left-padded so every row's last prompt
    token sits in the last column."""
    width = max(len(ids) for ids in requests_ids)
    input_ids = torch.full((len(requests_ids), width), pad, dtype=torch.long)
    valid = torch.zeros((len(requests_ids), width), dtype=torch.bool)
    for i, ids in enumerate(requests_ids):
        input_ids[i, width - len(ids):] = torch.as_tensor(ids, dtype=torch.long)
        valid[i, width - len(ids):] = True
    return input_ids, valid


class _Forward:
    """model(...), or its lean equivalent where there is one (`lean`), with the batch's variants
    applied, returning last logits."""

    def __init__(self, resident: ResidentModel, batch: RowVariants, lean: bool = True):
        self.model = resident.model
        self.state = resident.state
        self.batch = batch
        self.cache_kw = cache_argument(resident.model)
        self.lean = lean_llama.lean_forward(resident.model, batch) if lean else None

    def __call__(self, input_ids, mask, positions, cache, prefill: bool = False) -> torch.Tensor:
        with self.state.applied(self.batch, plain=prefill):
            if self.lean is not None:
                return self.lean(input_ids, mask, positions, cache, plain=prefill)
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                             use_cache=True, logits_to_keep=1, **{self.cache_kw: cache})
        return out.logits[:, -1, :]   # [B, V]


class DynamicStepper:
    """transformers' DynamicCache and 2-D mask: the reference semantics."""

    def __init__(self, resident: ResidentModel, batch: RowVariants):
        self.forward = _Forward(resident, batch, lean=False)
        self.device = resident.device
        self.cache = None

    @torch.inference_mode()
    def prefill(self, input_ids, valid):
        self.mask = valid.to(self.device, torch.long)
        self.positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        logits, self.cache = self._run(input_ids.to(self.device), prefill=True)
        return logits

    @torch.inference_mode()
    def step(self, next_ids):
        rows = len(next_ids)
        self.mask = torch.cat([self.mask, self.mask.new_ones((rows, 1))], dim=1)
        self.positions = self.positions[:, -1:] + 1
        logits, self.cache = self._run(torch.tensor(next_ids, device=self.device).unsqueeze(1))
        return logits

    def _run(self, input_ids, prefill: bool = False):
        f = self.forward
        with f.state.applied(f.batch, plain=prefill):
            out = f.model(input_ids=input_ids, attention_mask=self.mask, position_ids=self.positions,
                          use_cache=True, logits_to_keep=1, **{f.cache_kw: self.cache})
        return out.logits[:, -1, :], getattr(out, f.cache_kw)


class StaticStepper:
    """The pre-allocated cache, written in place; masks are views of one buffer."""

    def __init__(self, resident: ResidentModel, batch: RowVariants, cache):
        self.forward = _Forward(resident, batch)
        self.device = resident.device
        self.cache = cache

    @torch.inference_mode()
    def prefill(self, input_ids, valid):
        valid = valid.to(self.device)
        mask = self.cache.start(valid)
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)                 # [B, W]
        logits = self.forward(input_ids.to(self.device), mask, positions, self.cache, prefill=True)
        self.cache.advance(input_ids.shape[1])
        self.positions = positions[:, -1:].clone()                             # [B, 1]
        return logits

    @torch.inference_mode()
    def step(self, next_ids):
        cache = self.cache
        if cache.length + 1 > cache.capacity:
            cache.reserve(cache.batch, cache.length + 1)                      # doubles: rare
        self.positions += 1
        ids = torch.tensor(next_ids, device=self.device).unsqueeze(1)          # [B, 1]
        logits = self.forward(ids, cache.step_mask(), self.positions, cache)
        cache.advance(1)
        return logits


class FixedShapeStepper(StaticStepper):
    """Every decode step has the same shapes and tensor addresses: the cache returns whole buffers,
    the mask is opened one column per step on the device, positions advance on the device and the
    input ids are copied into one static tensor. Eager here (and testable on CPU); what the CUDA
    graph below captures."""

    def __init__(self, resident: ResidentModel, batch: RowVariants, cache):
        if not cache.full_views:
            raise ValueError("a fixed-shape stepper needs a full-views cache")
        super().__init__(resident, batch, cache)

    @torch.inference_mode()
    def prefill(self, input_ids, valid):
        logits = super().prefill(input_ids, valid)
        self.ids = torch.zeros((input_ids.shape[0], 1), dtype=torch.long, device=self.device)   # static input
        return logits

    def _body(self) -> torch.Tensor:
        """Everything one token does on the device, host-sync free; advances the device-side
        write position and positions itself."""
        cache = self.cache
        cache.open_next_column()
        self.positions += 1
        logits = self.forward(self.ids, cache.step_mask(), self.positions, cache)
        cache.write_position.add_(1)
        return logits

    @torch.inference_mode()
    def step(self, next_ids):
        cache = self.cache
        if cache.length + 1 > cache.capacity:
            raise RuntimeError("a fixed-shape cache is sized for the whole request up front")
        self.ids.copy_(torch.tensor(next_ids).view(-1, 1), non_blocking=True)
        logits = self._run_body()
        cache.length += 1                      # host mirror of write_position (the device moved that)
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
    """A stepper with its cache checked out. "auto": the fastest one that serves this model
    exactly (graphed on CUDA for requests long enough to repay the capture, else static; dynamic
    for attention layouts the static cache does not model). The others force one, for tests and
    benchmarks."""
    if kind not in STEPPERS:
        raise ValueError(f"stepper must be one of {', '.join(STEPPERS)}, got {kind!r}")
    if kind == "auto":
        kind = "static" if static_cache_supported(resident.model) else "dynamic"
        if kind == "static" and resident.device.type == "cuda" and resident.graphs and max_new >= GRAPH_MIN_TOKENS:
            kind = "graphed"
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
