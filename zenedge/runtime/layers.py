"""The model transform: target nn.Linear modules become VariantLinear, which adds, per batch row,
that row's variant (LoRA low-rank path, BitDelta 1-bit path) on top of the untouched base weight.

The model itself knows nothing about adapters (as in gpt-fast, the transform is applied from
outside). Which variant each row uses is set for a forward pass through a shared `RowVariants`
object, so one forward serves a mixed batch.

In a decode step the rows are different requests, and a request must get the same tokens alone as
in any batch: every product here then sums a row the same way whatever the other rows are. The
int4 and bf16 kernels do (cpu_weights); a LoRA's small fp32 products go through `add_lora_`, and a
packed BitDelta's fp32 path one row at a time (torch's fp32 BLAS takes other paths, and other
summation orders, for one row than for several). A prefill is one request's tokens: one product.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zenedge.kernels import native
from zenedge.merge.factors import LoraFactors
from zenedge.runtime.cpu_weights import CpuWeight, linear as fast_linear
from zenedge.runtime.variants import BitDeltaModule, Variant


@dataclass
class RowVariants:
    """Per-row variants of the current batch (None = the plain base), grouped once per batch."""

    rows: list[Variant | None] = field(default_factory=list)
    groups: list[tuple[Variant, torch.Tensor]] = field(default_factory=list)  # (variant, row indices)
    uniform: Variant | None = None  # set when every row uses the same variant (the common case)

    @classmethod
    def build(cls, rows: Sequence[Variant | None], device: torch.device) -> "RowVariants":
        distinct: dict[str, tuple[Variant, list[int]]] = {}
        for i, variant in enumerate(rows):
            if variant is not None:
                distinct.setdefault(variant.key, (variant, []))[1].append(i)
        uniform = None
        if len(distinct) == 1:
            variant, idx = next(iter(distinct.values()))
            uniform = variant if len(idx) == len(rows) else None
        groups = [(v, torch.tensor(idx, device=device, dtype=torch.long)) for v, idx in distinct.values()]
        return cls(list(rows), groups, uniform)


class VariantLinear(nn.Module):
    """y = x·Wᵀ (+b) + the row's variant delta. W stays the base's tensor, never modified."""

    def __init__(self, base: nn.Linear, name: str, state: "VariantState"):
        super().__init__()
        self.base = base
        self.name = name
        self.state = state
        self.fast: CpuWeight | None = None   # matmul copy of base.weight: packed bf16 / int8 / int4 (cpu_weights.py)

    @property
    def weight(self) -> torch.Tensor:  # transformers sometimes peeks at .weight (dtype/device)
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, T, in] during generation: batch rows are requests, each with its own variant.
        batch = self.state.current
        if batch is None or not batch.groups:
            return self._base(x)
        per_row = not self.state.plain          # a decode step: rows are requests
        if batch.uniform is not None:  # one variant for the whole batch: no gathers
            module = batch.uniform.modules.get(self.name)
            if module is None:
                return self._base(x)
            if isinstance(module, BitDeltaModule):
                return self._bitdelta(x, module)
            y = self._base(x)
            add_lora_(y.view(-1, y.shape[-1]), x.reshape(-1, x.shape[-1]), module, per_row=per_row)
            return y
        y = self._base(x)
        for variant, idx in batch.groups:
            module = variant.modules.get(self.name)
            if module is None:
                continue
            rows = x.index_select(0, idx)
            if isinstance(module, LoraFactors):   # the same sums as a batch of these rows alone
                part = y.index_select(0, idx)
                add_lora_(part.view(-1, part.shape[-1]), rows.reshape(-1, rows.shape[-1]), module, per_row=per_row)
                y.index_copy_(0, idx, part)
            else:  # BitDelta rows: the fused path gives base + delta, replacing the base rows
                y.index_copy_(0, idx, self._bitdelta(rows, module))
        return y

    def step_delta(self, batch: RowVariants | None) -> "LoraFactors | BitDeltaModule | VariantLinear | None":
        """What the rows of `batch` add to this linear's base product: None (no row's variant
        touches it), the one LoRA or BitDelta module every row uses, or this module itself
        (rows with different variants: only forward() knows how to mix them)."""
        if batch is None or not batch.groups:
            return None
        if batch.uniform is not None:
            return batch.uniform.modules.get(self.name)
        return self if any(self.name in variant.modules for variant, _ in batch.groups) else None

    def base_fn(self, *, cast: bool = True):
        """The base product for a decode step (2-D x, not plain): the fast copy's kernel itself
        (`cast`: see CpuWeight.matmul_fn)."""
        if self.fast is None:
            return partial(F.linear, weight=self.base.weight, bias=self.base.bias)
        return self.fast.matmul_fn(self.base.bias, cast=cast)

    def bound(self, batch: RowVariants | None, *, cast: bool = True):
        """What a decode step of `batch` (2-D x, not plain) may call instead of this module, with
        the same result and ~8 µs less Python: the base kernel where no variant touches this
        linear, plus the LoRA product or through the hot BitDelta's dense copy where one variant
        does; the module for mixed rows. `cast=False`: the result may stay in the kernel's dtype
        where the caller only adds it to an fp32 tensor (CpuWeight.matmul_fn)."""
        delta = self.step_delta(batch)
        if delta is None:
            return self.base_fn(cast=cast)
        if isinstance(delta, LoraFactors):
            base = self.base_fn()
            return lambda x: add_lora_(base(x), x, delta, per_row=True)
        if isinstance(delta, BitDeltaModule):
            bias = self.base.bias

            def bitdelta(x):
                # delta.dense is read per call: the cache may densify or drop it mid-request. Its
                # kernel called directly, not through _bitdelta: 0.88× → 0.95-1.0× of the base.
                dense = delta.dense
                if isinstance(dense, CpuWeight):
                    return dense.matmul_fn(bias, cast=cast)(x)
                return self._bitdelta(x, delta)
            return bitdelta
        return self

    def _base(self, x: torch.Tensor) -> torch.Tensor:
        # Functional calls: no nn.Module dispatch for the inner linear (210 of them per token).
        # A decode loop's prefill (and teacher-forced scoring, which reads text the same way)
        # multiplies with the plain weights, not int8/int4 copies: it is compute-bound, where fp32
        # GEMM beats kernels that dequantise as they go (int4 wins below ~32 rows, fp32 is 2×
        # faster at 256). Always, not by size: a request must give the same tokens alone as in
        # any batch. Decode steps, and forwards that do not ask (`plain=False`), use the copies.
        if self.fast is None or (self.state.plain and self.fast.lossy):
            return F.linear(x, self.base.weight, self.base.bias)
        return self.fast.linear(x, self.base.bias)

    def _bitdelta(self, x: torch.Tensor, module: BitDeltaModule) -> torch.Tensor:
        """x·(W + α⊙S)ᵀ + b through the fused kernel (CUDA) or the CPU path, never materialising
        W+α⊙S, unless the cache holds a reconstructed dense weight for this hot variant (then
        this reads exactly what the base reads)."""
        dense = module.dense
        if dense is not None:
            return fast_linear(x, dense, self.base.bias)   # plain or in the base's fast format
        from zenedge.kernels import bitdelta_linear

        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights = (self.base.weight, module.packed, module.alpha, self.base.bias)
        if flat.shape[0] > 1 and flat.device.type == "cpu" and not self.state.plain:
            # a decode step's rows are requests: each through the one-row path (its fp32 matmul)
            out = torch.cat([bitdelta_linear(flat[i:i + 1], *weights) for i in range(flat.shape[0])])
        else:
            out = bitdelta_linear(flat, *weights)
        return out.reshape(*shape[:-1], out.shape[-1])


_KERNEL = "_zenedge_lora_kernel"


def add_lora_(y: torch.Tensor, x: torch.Tensor, factors: LoraFactors, *, per_row: bool) -> torch.Tensor:
    """y += scale·(x·Aᵀ)·Bᵀ in place; y: [N, out] (rows may be strided, e.g. a slice of a stacked
    product), x: [N, in]. Low rank first: x·Aᵀ is [N, r], so the delta costs ~2·r·(in+out) per row.

    `per_row`: the rows are different requests (a decode step), so each must be summed the same way
    whatever the others are: the C kernel (kernels/lora_add.c) where it takes the factors (fp32 on
    the CPU; decided by the factors alone, never by N), else one row at a time through torch's
    one-row path. Otherwise (one request's tokens: a prefill, scoring) one BLAS product, addmm_
    fusing the second product, the scale and the add."""
    a_t, b_t = factors.transposed
    if not per_row:
        low = x @ a_t                                                   # [N, r]
        if low.dtype != b_t.dtype:  # under autocast (the quality gate's bf16 scoring): autocast picks the dtype
            return y.add_(low @ b_t, alpha=factors.scale)
        return y.addmm_(low, b_t, alpha=factors.scale)
    kernel = _lora_kernel(factors)
    if kernel is not None and x.dtype == y.dtype == torch.float32:
        return kernel(y, x)
    for i in range(x.shape[0]):
        y[i:i + 1].addmm_(x[i:i + 1] @ a_t, b_t, alpha=factors.scale)
    return y


def _lora_kernel(factors: LoraFactors):
    """The factors' C kernel (native.lora_add_fn), made once and kept on them (as their
    `transposed` views are), or None where it does not apply."""
    cached = factors.__dict__
    if _KERNEL not in cached:
        cached[_KERNEL] = native.lora_add_fn(factors.A, factors.B.t(), factors.scale)
    return cached[_KERNEL]


class VariantState:
    """Shared by every VariantLinear of one model: the batch's per-row variants. The selection is
    per thread, so two threads running batches on one resident never see each other's rows."""

    def __init__(self, device: torch.device):
        self.device = device
        self._local = threading.local()

    @property
    def current(self) -> RowVariants | None:
        return getattr(self._local, "batch", None)

    @current.setter
    def current(self, batch: RowVariants | None) -> None:
        self._local.batch = batch

    @contextmanager
    def using(self, rows: Sequence[Variant | None], *, plain: bool = False) -> Iterator[RowVariants]:
        with self.applied(RowVariants.build(rows, self.device), plain=plain) as batch:
            yield batch

    @property
    def plain(self) -> bool:
        """True where the current forward asked for the plain weights (VariantLinear._base)."""
        return getattr(self._local, "plain", False)

    @contextmanager
    def applied(self, batch: RowVariants, *, plain: bool = False) -> Iterator[RowVariants]:
        """Apply an already grouped batch (the decode loop groups once per request, not per
        token). `plain`: multiply with the plain weights, not int8/int4 copies (prefill, scoring)."""
        previous = self.current, self.plain
        self.current, self._local.plain = batch, plain
        try:
            yield batch
        finally:
            self.current, self._local.plain = previous


DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def patch_model(model: nn.Module, device: torch.device, targets: Sequence[str] = DEFAULT_TARGETS) -> VariantState:
    """Swap every target nn.Linear inside the decoder layers for a VariantLinear (in place).
    Returns the shared state through which batches select their variants."""
    state = VariantState(device)
    replacements = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets and ".layers." in f".{name}":
            replacements.append((name, module))
    for name, module in replacements:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, VariantLinear(module, name, state))
    state.modules = [name for name, _ in replacements]
    return state
