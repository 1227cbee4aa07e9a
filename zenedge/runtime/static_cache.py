"""A pre-allocated KV cache for the decode loop, reused across requests.

transformers' DynamicCache grows every layer's keys and values with torch.cat at every token (a
copy of the whole history per layer per step), and the 2-D attention mask grows the same way.
Here every layer owns a buffer [B, H_kv, capacity, D] (a view of one allocation for all layers,
so a decode step can view every layer's slot at once: `decode_slots`) written in place; the
attention mask is an additive [B, 1, 1, capacity] buffer filled once per request (left pads
masked, every later column visible), so a decode step touches no mask at all.

The model sees a duck-typed cache: its attention layers call `update(k, v, layer_idx, ...)` and
get back the keys/values written so far. The mask is passed ready-made in 4-D, which transformers
returns as-is, so the cache needs none of transformers' internal mask-size API (it changed
between 4.x and 5.x; this object works with both).

Two modes:
- views (CPU, default): `update` copies into a slice and returns views of the filled prefix, so
  attention costs what the request's length costs, not the capacity.
- full (CUDA graphs): `update` writes with `index_copy_` at a device-side position tensor and
  returns whole buffers; the mask hides unwritten columns and is opened column by column on the
  device. Every shape and address is fixed, so one captured step replays for every token.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import torch

CAPACITY_STEP = 128   # capacities are rounded up to this, so similar requests reuse one allocation


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


class StaticKVCache:
    """Per-layer K/V buffers and the additive attention mask of one batch."""

    is_compileable = False   # transformers asks; we are not its StaticCache

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 *, full_views: bool = False):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.full_views = full_views
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._all: tuple[torch.Tensor, torch.Tensor] | None = None   # (keys, values) of every layer: reserve()
        self.mask: torch.Tensor | None = None        # [B_cap, 1, 1, capacity] additive, model dtype
        self.batch_capacity = 0
        self.capacity = 0
        self.batch = 0                                # rows of the current request
        self.length = 0                               # columns written (all rows share columns)
        # Full mode: where the next token's K/V go, kept on the device so a graph can advance it.
        self.write_position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.allocations = 0                          # how often buffers were (re)allocated: tests read it

    # -- sizing --------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        per = sum(t.numel() * t.element_size() for t in self.keys + self.values)
        return per + (self.mask.numel() * self.mask.element_size() if self.mask is not None else 0)

    def reserve(self, batch: int, length: int) -> None:
        """Make room for `batch` rows of `length` columns, keeping what is written (grows ×2)."""
        if batch <= self.batch_capacity and length <= self.capacity:
            return
        capacity = max(_round_up(length, CAPACITY_STEP), self.capacity * 2 if length > self.capacity else self.capacity)
        batch_capacity = max(batch, self.batch_capacity)
        # One buffer per kind for all layers (decode_slots views every layer's slot at once);
        # keys[i] / values[i] are its per-layer views.
        shape = (self.layers, batch_capacity, self.kv_heads, capacity, self.head_dim)
        all_keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        all_values = torch.zeros(shape, dtype=self.dtype, device=self.device)
        keys, values = list(all_keys.unbind(0)), list(all_values.unbind(0))
        mask = torch.zeros((batch_capacity, 1, 1, capacity), dtype=self.dtype, device=self.device)
        if self.length:   # growing mid-request: keep the history and the padding pattern
            rows, cols = self.batch, self.length
            for new, old in zip(keys + values, self.keys + self.values):
                new[:rows, :, :cols].copy_(old[:rows, :, :cols])
            mask[:rows, :, :, :cols].copy_(self.mask[:rows, :, :, :cols])
            if self.full_views:
                mask[:rows, :, :, cols:] = torch.finfo(self.dtype).min
        self.keys, self.values, self.mask = keys, values, mask
        self._all = (all_keys, all_values)
        self.batch_capacity, self.capacity = batch_capacity, capacity
        self.allocations += 1

    # -- one request -----------------------------------------------------------------------------
    def start(self, valid: torch.Tensor) -> torch.Tensor:
        """Begin a request whose prompt columns are `valid` [B, W] (False = left pad); returns the
        prefill's additive mask [B, 1, W, W] (views) or [B, 1, W, capacity] (full)."""
        batch, width = valid.shape
        if batch > self.batch_capacity or width > self.capacity:
            raise ValueError(f"reserve({batch}, {width}) first: capacity is {self.batch_capacity}×{self.capacity}")
        self.batch, self.length = batch, 0
        self.write_position.zero_()
        low = torch.finfo(self.dtype).min
        valid = valid.to(self.device)
        decode_mask = self.mask[:batch, 0, 0]                                     # [B, capacity]
        decode_mask.zero_()
        decode_mask[:, :width].masked_fill_(~valid, low)                          # pads stay hidden forever
        if self.full_views:
            decode_mask[:, width:] = low                                          # opened one column per step
        columns = self.capacity if self.full_views else width
        causal = torch.ones(width, columns, dtype=torch.bool, device=self.device).tril()   # query i sees j <= i
        keep = causal.expand(batch, width, columns).clone()                                # [B, W, cols]
        keep[:, :, :width] &= valid[:, None, :]
        prefill = torch.zeros((batch, 1, width, columns), dtype=self.dtype, device=self.device)
        return prefill.masked_fill_(~keep[:, None], low)

    def step_mask(self) -> torch.Tensor:
        """The decode step's additive mask [B, 1, 1, length+1] (views) or [B, 1, 1, capacity] (full)."""
        if self.full_views:
            return self.mask[:self.batch]
        return self.mask[:self.batch, :, :, :self.length + 1]

    def open_next_column(self) -> None:
        """Full mode, on the device: the column about to be written becomes visible to every row."""
        self.mask[:self.batch].index_fill_(-1, self.write_position, 0.0)

    def advance(self, width: int) -> None:
        """After a forward of `width` new columns (called by the loop, not by the model)."""
        self.length += width
        if self.full_views:
            self.write_position.add_(width)

    # -- what the model calls ------------------------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states: [B, H_kv, T, D] for the T new columns of this forward
        keys, values = self.keys[layer_idx][:self.batch], self.values[layer_idx][:self.batch]
        width = key_states.shape[-2]
        if self.full_views:
            where = self.write_position if width == 1 else self.write_position + torch.arange(width, device=self.device)
            keys.index_copy_(2, where, key_states)
            values.index_copy_(2, where, value_states)
            return keys, values
        end = self.length + width
        keys[:, :, self.length:end].copy_(key_states)
        values[:, :, self.length:end].copy_(value_states)
        return keys[:, :, :end], values[:, :, :end]

    def decode_slots(self) -> list[tuple[torch.Tensor, ...]] | None:
        """Views mode, a decode step (one new column): per layer (key slot, value slot) [B, H_kv, D]
        to write the new column into, and (keys, values) [B, H_kv, length+1, D] to attend over,
        made in eight ops for all layers (`update` costs eight per layer). None in full mode.
        The caller advances the length after the step, as with `update`."""
        if self.full_views:
            return None
        keys, values = self._all
        rows, column = self.batch, self.length
        return list(zip(keys[:, :rows, :, column].unbind(0), values[:, :rows, :, column].unbind(0),
                        keys[:, :rows, :, :column + 1].unbind(0), values[:, :rows, :, :column + 1].unbind(0)))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity


class KVCachePool:
    """The static caches of one resident model: one is kept between requests (so a request
    allocates nothing once a similar one has run); concurrent requests get their own."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self._shape = (layers, kv_heads, head_dim, dtype, torch.device(device))
        self._idle: dict[bool, StaticKVCache] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> "KVCachePool":
        config = model.config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, kv_heads, head_dim, dtype, device)

    @contextmanager
    def acquire(self, batch: int, length: int, *, full_views: bool = False) -> Iterator[StaticKVCache]:
        with self._lock:
            cache = self._idle.pop(full_views, None)
        if cache is None:
            cache = StaticKVCache(*self._shape, full_views=full_views)
        cache.reserve(batch, length)
        try:
            yield cache
        finally:
            cache.length = 0
            with self._lock:
                kept = self._idle.get(full_views)
                if kept is None or kept.nbytes < cache.nbytes:   # keep the larger one
                    self._idle[full_views] = cache

    def release(self) -> None:
        """Free the idle buffers (memory pressure, model unload)."""
        with self._lock:
            self._idle.clear()

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._idle.values())
