"""A pre-allocated KV cache for the decode loop, reused across requests.

transformers' DynamicCache grows every layer's keys and values with torch.cat at every token (a
copy of the whole history per layer per step), and the 2-D attention mask grows the same way.
Here every layer owns a buffer [B, H_kv, capacity, D] (a view of one allocation for all layers,
so a decode step can view every layer's columns at once: `step_view`) written in place.

Every row (a request) has its own length. Its prompt is written from column 0, one chunk at a
time by a forward of that row alone (`chunk`), and each decode step writes every row's new token
at that row's own next column. So a row's keys sit at the same positions, and its attention sums
the same terms in the same order, whatever the other rows hold: a request decodes the same tokens
alone as in a batch, and one row can still be prefilling while the others decode. The additive
mask [B, 1, 1, capacity] shows each row its written columns and hides the rest; columns are
opened as they are written.

The model sees a duck-typed cache: its attention layers call `update(k, v, layer_idx, ...)` and
get back the keys/values written so far (a decode step: this object; a row's prefill chunk: a
`RowChunk`). The mask is passed ready-made in 4-D, which transformers returns as-is, so the cache
needs none of transformers' internal mask-size API (it changed between 4.x and 5.x).

Two modes:
- views (CPU, default): a step's keys and values are views of the first (longest row + 1)
  columns, so attention costs what the requests' lengths cost, not the capacity.
- full (CUDA graphs): a step returns whole buffers, and every row's length lives on the device
  (`written`), so one captured step replays for every token: it writes each row's new column
  with `index_copy_`, opens it in the mask and advances the rows that are live, on the device.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

CAPACITY_STEP = 128   # capacities are rounded up to this, so similar requests reuse one allocation


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


@dataclass
class StepView:
    """One decode step's view of the cache, for `rows` rows (each writes one new column)."""

    positions: torch.Tensor        # [n] long: the column (= position) of each row's new token
    lengths: torch.Tensor          # [n] long: positions + 1, the columns each row attends over
    host_lengths: list[int] | None  # the same on the host (None where a CUDA graph replays the step)
    mask: torch.Tensor             # [n, 1, 1, L] additive: each row's columns (L: longest + 1, or capacity)
    # per layer: (write(k, v) with k, v [n, H_kv, D], keys [n, H_kv, L, D], values [n, H_kv, L, D])
    layers: list[tuple[Callable[[torch.Tensor, torch.Tensor], None], torch.Tensor, torch.Tensor]]


class StaticKVCache:
    """Per-layer K/V buffers and the additive attention mask of one batch of rows."""

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
        self.batch = 0                                # rows of the current batch
        self.lengths: list[int] = []                  # columns written, per row (host)
        # Full mode: the same on the device, so a captured step can advance it.
        self.written = torch.zeros(0, dtype=torch.long, device=self.device)
        self._view: StepView | None = None            # the step in progress (update() writes through it)
        self.allocations = 0                          # how often buffers were (re)allocated: tests read it

    # -- sizing --------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        per = sum(t.numel() * t.element_size() for t in self.keys + self.values)
        return per + (self.mask.numel() * self.mask.element_size() if self.mask is not None else 0)

    @property
    def low(self) -> float:
        return torch.finfo(self.dtype).min

    def reserve(self, batch: int, length: int) -> None:
        """Make room for `batch` rows of `length` columns, keeping what is written (grows ×2)."""
        if batch <= self.batch_capacity and length <= self.capacity:
            return
        capacity = max(_round_up(length, CAPACITY_STEP), self.capacity * 2 if length > self.capacity else self.capacity)
        batch_capacity = max(batch, self.batch_capacity)
        # One buffer per kind for all layers (step_view views every layer's columns at once);
        # keys[i] / values[i] are its per-layer views.
        shape = (self.layers, batch_capacity, self.kv_heads, capacity, self.head_dim)
        all_keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        all_values = torch.zeros(shape, dtype=self.dtype, device=self.device)
        mask = torch.full((batch_capacity, 1, 1, capacity), self.low, dtype=self.dtype, device=self.device)
        written = torch.zeros(batch_capacity, dtype=torch.long, device=self.device)
        rows, cols = self.batch, max(self.lengths[:self.batch], default=0)
        if rows:          # growing mid-request: keep every row's history and mask
            all_keys[:, :rows, :, :cols].copy_(self._all[0][:, :rows, :, :cols])
            all_values[:, :rows, :, :cols].copy_(self._all[1][:, :rows, :, :cols])
            mask[:rows, :, :, :self.capacity].copy_(self.mask[:rows])
            written[:rows].copy_(self.written[:rows])
        self.keys, self.values = list(all_keys.unbind(0)), list(all_values.unbind(0))
        self._all, self.mask, self.written = (all_keys, all_values), mask, written
        self.batch_capacity, self.capacity = batch_capacity, capacity
        self.allocations += 1

    # -- rows ------------------------------------------------------------------------------------
    def begin(self, rows: int) -> None:
        """Start a batch of `rows` empty rows (reserve room first)."""
        self.batch = 0
        self.lengths = []
        self.resize(rows)

    def resize(self, rows: int) -> None:
        """The batch now has `rows` rows: rows added start empty, rows dropped (at the end) are gone."""
        if rows > self.batch_capacity:
            raise ValueError(f"reserve({rows}, ...) first: room for {self.batch_capacity} rows")
        added = range(self.batch, rows)
        self.lengths = self.lengths[:rows] + [0] * len(added)
        self.batch = rows
        for row in added:
            self.reset_row(row)

    def reset_row(self, row: int) -> None:
        """Row `row` starts a new request: nothing written, every column hidden."""
        self.lengths[row] = 0
        self.written[row] = 0
        self.mask[row].fill_(self.low)

    def chunk(self, row: int, width: int) -> tuple["RowChunk", torch.Tensor]:
        """The next `width` prompt tokens of `row`, run alone: (the cache its forward writes
        through, its additive mask [1, 1, width, start + width], causal from the row's start)."""
        start = self.lengths[row]
        if start + width > self.capacity:
            raise ValueError(f"reserve(..., {start + width}) first: capacity is {self.capacity}")
        query = torch.arange(start, start + width, device=self.device)[:, None]       # absolute positions
        key = torch.arange(start + width, device=self.device)[None, :]
        mask = torch.zeros((1, 1, width, start + width), dtype=self.dtype, device=self.device)
        mask.masked_fill_(key > query, self.low)                                     # query i sees j <= i
        return RowChunk(self, row, start, width), mask

    def advance_row(self, row: int, width: int) -> None:
        """After a chunk's forward: its columns are written and visible to the row's later steps."""
        start = self.lengths[row]
        self.mask[row, :, :, start:start + width] = 0.0
        self.lengths[row] = start + width
        self.written[row] += width

    # -- a decode step ---------------------------------------------------------------------------
    def step_view(self) -> StepView:
        """Every row writes its next column: live rows advance after the step (`end_step`), the
        others (finished, or still prefilling) write a column that is overwritten or never read.
        Views mode reads the lengths on the host; full mode works on the device only, so a CUDA
        graph can capture it."""
        rows, last = self.batch, self.capacity - 1
        if self.full_views:
            positions = self.written[:rows].clamp(max=last)
            host = None
        else:
            host = [min(length, last) for length in self.lengths[:rows]]
            positions = torch.tensor(host, device=self.device)
        self.mask[:rows, 0, 0].scatter_(1, positions[:, None], 0.0)                  # open the new columns
        lengths = positions + 1
        keys, values = self._all
        if self.full_views:
            width, views = self.capacity, (keys[:, :rows], values[:, :rows])
        else:
            width = max(host) + 1
            views = (keys[:, :rows, :, :width], values[:, :rows, :, :width])
        layers = list(zip(self._writers(positions, host), views[0].unbind(0), views[1].unbind(0)))
        self._view = StepView(positions, lengths, None if host is None else [p + 1 for p in host],
                              self.mask[:rows, :, :, :width], layers)
        return self._view

    def _writers(self, positions: torch.Tensor, host: list[int] | None):
        """Per layer, write(k, v) of every row's new column. Where the rows share one column (one
        row, or equal lengths), plain copies into strided views; else one index_copy_ per kind."""
        keys, values = self._all
        rows = self.batch
        if host is not None and len(set(host)) == 1:
            column = host[0]
            slots = zip(keys[:, :rows, :, column].unbind(0), values[:, :rows, :, column].unbind(0))
            return [lambda k, v, ks=ks, vs=vs: (ks.copy_(k), vs.copy_(v)) for ks, vs in slots]
        # Row r, head h, column c of a layer's [B_cap, H_kv, capacity, D] buffer is its flat row
        # (r·H_kv + h)·capacity + c.
        heads = torch.arange(rows * self.kv_heads, device=self.device).view(rows, self.kv_heads)
        index = (heads * self.capacity + positions[:, None]).view(-1)
        flat = (-1, self.head_dim)

        def writer(layer):
            key_rows = self.keys[layer].view(flat)
            value_rows = self.values[layer].view(flat)

            def write(k, v):
                key_rows.index_copy_(0, index, k.reshape(flat))
                value_rows.index_copy_(0, index, v.reshape(flat))
            return write
        return [writer(layer) for layer in range(self.layers)]

    def end_step(self, live: Sequence[bool]) -> None:
        """After a step (host): the live rows' new columns count."""
        self._view = None
        for row, advance in enumerate(live):
            if advance:
                self.lengths[row] += 1

    def advance_on_device(self, live: torch.Tensor) -> None:
        """Full mode, inside the step (what a CUDA graph replays): the live rows ([n] long 0/1)
        advance on the device; `end_step` keeps the host's copy in step afterwards."""
        self.written[:self.batch] += live

    # -- what the model calls in a decode step ---------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states: [n, H_kv, 1, D], the new column of every row (inside step_view ... end_step)
        write, keys, values = self._view.layers[layer_idx]
        write(key_states[:, :, 0], value_states[:, :, 0])
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths[:self.batch], default=0)

    def get_max_length(self) -> int:
        return self.capacity


class RowChunk:
    """The cache a row's prefill chunk sees: it writes columns start..start+T of that row only
    and returns the row's keys and values so far ([1, H_kv, start + T, D])."""

    is_compileable = False

    def __init__(self, cache: StaticKVCache, row: int, start: int, width: int):
        self.cache, self.row, self.start, self.end = cache, row, start, start + width

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states: [1, H_kv, T, D]
        row, start, end = self.row, self.start, self.end
        keys = self.cache.keys[layer_idx][row:row + 1]
        values = self.cache.values[layer_idx][row:row + 1]
        keys[:, :, start:end].copy_(key_states)
        values[:, :, start:end].copy_(value_states)
        return keys[:, :, :end], values[:, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.start

    def get_max_length(self) -> int:
        return self.cache.capacity


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
        cache.begin(batch)
        try:
            yield cache
        finally:
            cache.batch, cache.lengths, cache._view = 0, [], None
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
