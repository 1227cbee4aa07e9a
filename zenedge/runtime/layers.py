"""Per-row binding of variants: what each target linear computes for the rows of a batch.

`transforms.patch_model` makes the target nn.Linear modules VariantLinear, which adds, per batch
row, that row's variant (LoRA low-rank path, BitDelta 1-bit path) on top of the untouched base
weight; the model itself knows nothing about adapters (as in gpt-fast, the transform is applied
from outside). Which variant each row uses is set for a forward pass through a shared
`RowVariants` object, so one forward serves a mixed batch.

A decode step (lean_llama.py) does not call the modules: it calls what `bound` and `products`
give once per request (the base kernel itself, plus the LoRA product, or the hot BitDelta's
dense copy, where one variant covers every row; q/k/v and gate/up as one stacked product), and
`step_product` tells its C step what those multiply by. The modules themselves serve prefills,
scoring and mixed rows.

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
from zenedge.runtime import cpu_weights, threads
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

    @property
    def keeps_plain(self) -> bool:
        """Whether the plain weight is resident too (False once quantized_load dropped it: the
        fast copy is then the weight, for prefill and scoring as well)."""
        return self.base.weight.device.type != "meta"

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
                signs = self._signs(module, x)
                if signs is None:
                    return self._bitdelta(x, module)
                y = self._base(x)
                signs(y.view(-1, y.shape[-1]), x.reshape(-1, x.shape[-1]))
                return y
            y = self._base(x)
            add_lora_(y.view(-1, y.shape[-1]), x.reshape(-1, x.shape[-1]), module, per_row=per_row)
            return y
        y = self._base(x)
        for variant, idx in batch.groups:
            module = variant.modules.get(self.name)
            if module is None:
                continue
            rows = x.index_select(0, idx)
            signs = self._signs(module, x) if isinstance(module, BitDeltaModule) else None
            if isinstance(module, LoraFactors) or signs is not None:   # the same sums as these rows alone
                part = y.index_select(0, idx)
                flat, rows_flat = part.view(-1, part.shape[-1]), rows.reshape(-1, rows.shape[-1])
                if signs is not None:
                    signs(flat, rows_flat)
                else:
                    add_lora_(flat, rows_flat, module, per_row=per_row)
                y.index_copy_(0, idx, part)
            else:  # BitDelta rows otherwise: base + delta from its own path, replacing the base rows
                y.index_copy_(0, idx, self._bitdelta(rows, module))
        return y

    def _signs(self, module: BitDeltaModule, x: torch.Tensor):
        """The sign kernel that adds `module` to this linear's base product in a decode step
        (native.sign_add_fn: the step's int4 pass is shared by every row, the delta read packed),
        or None: the variant has a dense copy, the forward wants the plain weights, or the kernel
        does not apply (then `_bitdelta`)."""
        if module.dense is not None or (self.state.plain and self.keeps_plain) or x.dtype != torch.float32:
            return None
        return self.sign_kernel(module)

    def sign_kernel(self, module: BitDeltaModule):
        """`sign_kernel(module)` where this linear's decode product is the C int4 kernel's, whose
        bf16 rounding of the activations the sign kernel shares; None elsewhere (fp32 weights keep
        the exact packed path)."""
        return sign_kernel(module) if type(self.fast) is cpu_weights.NativeInt4Weight else None

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
        the same result and less Python: the base kernel where no variant touches this
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
            bias, base = self.base.bias, self.base_fn()

            def bitdelta(x):
                # delta.dense is read per call: the cache may densify or drop it mid-request. Its
                # kernel called directly, not through _bitdelta: nearly the base's speed.
                dense = delta.dense
                if isinstance(dense, CpuWeight):
                    return dense.matmul_fn(bias, cast=cast)(x)
                signs = self._signs(delta, x)
                if signs is not None:
                    return signs(base(x), x)
                return self._bitdelta(x, delta)
            return bitdelta
        return self

    def _base(self, x: torch.Tensor) -> torch.Tensor:
        # Functional calls: no nn.Module dispatch for the inner linear (one per linear per token).
        # A decode loop's prefill (and teacher-forced scoring, which reads text the same way)
        # multiplies with the plain weights, not int8/int4 copies: it is compute-bound, where fp32
        # GEMM beats kernels that dequantise as they go (those win only at a few rows). Always,
        # not by size: a request must give the same tokens alone as in
        # any batch. Decode steps, and forwards that do not ask (`plain=False`), use the copies.
        if self.fast is None or (self.state.plain and self.fast.lossy and self.keeps_plain):
            return F.linear(x, self.base.weight, self.base.bias)
        return self.fast.linear(x, self.base.bias)

    def _bitdelta(self, x: torch.Tensor, module: BitDeltaModule) -> torch.Tensor:
        """x·(W + α⊙S)ᵀ + b through the fused kernel (CUDA) or the CPU path, never materialising
        W+α⊙S, unless the cache holds a reconstructed dense weight for this hot variant (then
        this reads exactly what the base reads)."""
        dense = module.dense
        if dense is not None:
            return fast_linear(x, dense, self.base.bias)   # plain or in the base's fast format
        from zenedge.kernels.bitdelta import bitdelta_linear

        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights = (plain_weight(self), module.packed, module.alpha, self.base.bias)
        if flat.shape[0] > 1 and flat.device.type == "cpu" and not self.state.plain:
            # a decode step's rows are requests: each through the one-row path (its fp32 matmul)
            out = torch.cat([bitdelta_linear(flat[i:i + 1], *weights) for i in range(flat.shape[0])])
        else:
            out = bitdelta_linear(flat, *weights)
        return out.reshape(*shape[:-1], out.shape[-1])


class FastLinear(nn.Module):
    """An nn.Linear (the output head) that multiplies with a fast copy; `.weight` is still the
    plain parameter, so a tied embedding stays tied. `state` (the model's VariantState) says
    when a forward wants the plain weight instead."""

    def __init__(self, base: nn.Linear, fast: CpuWeight, state=None):
        super().__init__()
        self.base = base
        self.fast = fast
        self.state = state

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def bound(self, batch=None):
        """The fast copy's own product for a decode step (not plain): see VariantLinear.bound."""
        return self.fast.matmul_fn(self.base.bias)

    @property
    def keeps_plain(self) -> bool:
        return self.base.weight.device.type != "meta"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fast.lossy and self.state is not None and self.state.plain and self.keeps_plain:
            return F.linear(x, self.base.weight, self.base.bias)
        return self.fast.linear(x, self.base.bias)


def plain_weight(linear) -> torch.Tensor:
    """The weight a linear (VariantLinear, FastLinear, nn.Linear) multiplies by: its parameter,
    or, where only its quantized copy is resident, that copy dequantized (fp32, made per call)."""
    if getattr(linear, "keeps_plain", True):
        return linear.weight
    return linear.fast.dequantized().to(linear.weight.dtype)


_KERNEL = "_zenedge_lora_kernel"


def add_lora_(y: torch.Tensor, x: torch.Tensor, factors: LoraFactors, *, per_row: bool) -> torch.Tensor:
    """y += scale·(x·Aᵀ)·Bᵀ in place; y: [N, out] (rows may be strided, e.g. a slice of a stacked
    product), x: [N, in]. Low rank first: x·Aᵀ is [N, r], so the delta costs about 2·r·(in+out) per row.

    `per_row`: the rows are different requests (a decode step), so each must be summed the same way
    whatever the others are: the C kernel (kernels/native/lora_add.c) where it takes the factors (fp32 on
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


_SIGN_KERNEL = "_zenedge_sign_kernel"


def sign_kernel(module: BitDeltaModule):
    """The delta's C sign kernel (native.sign_add_fn), made once and kept on it, or None where it
    does not apply."""
    cached = module.__dict__
    if _SIGN_KERNEL not in cached:
        cached[_SIGN_KERNEL] = native.sign_add_fn(module.packed, module.alpha, module.in_features)
    return cached[_SIGN_KERNEL]


class VariantState:
    """Shared by every VariantLinear of one model: the batch's per-row variants. The selection is
    per thread, so two threads running batches on one resident never see each other's rows."""

    def __init__(self, device: torch.device):
        self.device = device
        self._local = threading.local()
        self.native_steps = False   # a decode step's products all run in the C kernels (convert_model)

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
        token). `plain`: multiply with the plain weights, not int8/int4 copies (prefill, scoring).
        Every forward on the resident starts here, so this is where its torch thread count is set
        (threads.py: a decode step on the C kernels takes one thread, other work the free cores)."""
        previous = self.current, self.plain
        self.current, self._local.plain = batch, plain
        try:
            with threads.pace(single_step=self.native_steps and not plain):
                yield batch
        finally:
            self.current, self._local.plain = previous


# -- a decode step's linears, bound once per request (lean_llama calls these) ----------------------

def bound(linear, batch: RowVariants | None, *, cast: bool = True):
    """`linear` as a decode step of `batch` may call it (VariantLinear.bound, FastLinear.bound),
    or the module itself (a plain nn.Linear, a wrapper we do not know)."""
    if isinstance(linear, VariantLinear):
        return linear.bound(batch, cast=cast)
    method = getattr(linear, "bound", None)
    return method(batch) if method is not None else linear


def each(*linears):
    """Several linears on one input, their outputs side by side."""
    return lambda h: torch.cat([linear(h) for linear in linears], -1)


def _slices(linears, modules) -> "StepDelta | None":
    """What one variant's `modules` (one per linear, None where it leaves it alone) add to the
    linears' stacked product, as LoRA and sign slices at their output columns; None where a slice
    is neither (a dense copy, a delta the sign kernel does not take)."""
    delta, offset = StepDelta(None, [], []), 0
    for linear, module in zip(linears, modules):
        width = linear.weight.shape[0]
        if isinstance(module, LoraFactors):
            delta.loras.append((offset, width, module))
        elif isinstance(module, BitDeltaModule):
            if module.dense is not None or linear.sign_kernel(module) is None:
                return None
            delta.signs.append((offset, width, module))
        elif module is not None:
            return None
        offset += width
    return delta


def _uniform_plan(linears, batch: RowVariants | None):
    """For a decode step whose rows all use one variant (or none): (the copy each linear's product
    reads: the base's fast copy, or a BitDelta's dense copy; those dense copies as [(delta, copy)];
    the LoRA and sign slices added on top). None where the step is not that: mixed rows, modules we
    do not know, a dense copy beside another delta, a delta no kernel takes."""
    deltas = [linear.step_delta(batch) if isinstance(linear, VariantLinear) else linear for linear in linears]
    if not all(d is None or isinstance(d, (LoraFactors, BitDeltaModule)) for d in deltas):
        return None                                         # mixed rows (step_delta: the module), unknown modules
    hot = [(d, d.dense) for d in deltas if isinstance(d, BitDeltaModule) and d.dense is not None]
    parts = [d.dense if isinstance(d, BitDeltaModule) and d.dense is not None else linear.fast
             for d, linear in zip(deltas, linears)]
    if hot:
        if len(hot) != sum(d is not None for d in deltas):
            return None                                     # a dense copy beside another delta; keep it exact
        return parts, hot, StepDelta(None, [], [])
    added = _slices(linears, deltas)
    return None if added is None else (parts, [], added)


def products(linears, batch: RowVariants | None):
    """h → the linears' outputs side by side, for a decode step of `batch`: one kernel call on
    their stacked copies (cpu_weights.stacked: bit for bit the same products) where each linear
    adds at most a LoRA or a packed BitDelta (on its slice) or reads a BitDelta's dense copy
    (`_uniform_plan`); else `each` of their bound steps."""
    one_by_one = each(*(bound(linear, batch) for linear in linears))
    plan = _uniform_plan(linears, batch)
    if plan is None:
        return one_by_one
    parts, hot, added = plan
    biases = [linear.base.bias for linear in linears]
    stacked = cpu_weights.stacked(parts) if len({bias is None for bias in biases}) == 1 else None
    if stacked is None:
        return one_by_one
    product = stacked.matmul_fn(None if biases[0] is None else torch.cat([bias.detach() for bias in biases]))
    if hot:
        def dense(h):
            # The cache may drop a dense copy (or densify anew) mid-request: the stacked copy
            # serves only while every part is still the variant's.
            for delta, part in hot:
                if delta.dense is not part:
                    return one_by_one(h)
            return product(h)
        return dense
    if not added.loras and not added.signs:
        return product

    def with_deltas(h):
        if added.signs and (h.dtype != torch.float32 or any(m.dense is not None for _, _, m in added.signs)):
            return one_by_one(h)                            # densified since, or not the sign kernel's dtype
        y = product(h)
        for offset, width, factors in added.loras:          # each added as its own linear adds it
            add_lora_(y[:, offset:offset + width], h, factors, per_row=True)
        for offset, width, module in added.signs:
            sign_kernel(module)(y[:, offset:offset + width], h)
        return y
    return with_deltas


@dataclass
class StepDelta:
    """What one variant adds to a decode step's product of a group of linears, on its rows."""

    rows: torch.Tensor | None                             # the step's rows it applies to (int64); None: all
    loras: list[tuple[int, int, LoraFactors]]             # (first output column, width, factors)
    signs: list[tuple[int, int, BitDeltaModule]]          # (first output column, width, packed delta)


@dataclass
class StepProduct:
    """What a decode step of one request multiplies a group of linears by (`step_product`)."""

    weight: CpuWeight | None          # the parts' copy, stacked where there are several
    deltas: list[StepDelta]           # each variant's slices on its rows
    hot: list[tuple[BitDeltaModule, CpuWeight]]          # (delta, the dense copy `weight` holds)


def step_product(linears, batch: RowVariants | None) -> StepProduct | None:
    """The product a decode step of `batch` makes of `linears` (VariantLinears without bias), as
    data for a caller that runs it elsewhere (c_step.FusedStep): one copy for every row (the
    base's, or, where one variant covers every row, its dense copy), and each variant's LoRA and
    sign slices on its rows. None where that is not what the Python step computes: a bias, a dense
    copy in a mixed batch or beside another delta, a delta no kernel takes."""
    if not all(isinstance(linear, VariantLinear) and linear.base.bias is None for linear in linears):
        return None
    if batch is not None and batch.groups and batch.uniform is None:    # mixed rows: the base, then each variant
        if not all(type(linear.fast) is cpu_weights.NativeInt4Weight for linear in linears):
            return None                                     # only the C step takes mixed rows
        deltas = []
        for variant, rows in batch.groups:
            added = _slices(linears, [variant.modules.get(linear.name) for linear in linears])
            if added is None:
                return None
            if added.loras or added.signs:
                added.rows = rows
                deltas.append(added)
        return StepProduct(_stacked([linear.fast for linear in linears]), deltas, [])
    plan = _uniform_plan(linears, batch)
    if plan is None:
        return None
    parts, hot, added = plan
    return StepProduct(_stacked(parts), [added] if added.loras or added.signs else [], hot)


def _stacked(parts) -> CpuWeight | None:
    return parts[0] if len(parts) == 1 else cpu_weights.stacked(parts)
