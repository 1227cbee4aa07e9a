"""The decode step as one C call (kernels/native/decode_step.c): the binding of a lean forward's
step (lean_llama.LeanLlama) to the C kernel's structures.

`FusedStep.build` fills one `native.Layer` per layer from what the Python step multiplies
(layers.step_product: the int4 copies stacked, each row's variant as LoRA or packed sign slices),
or says why it cannot (`c_step_fallback`: doctor and /api/ps report it); the lean forward then
runs its Python step, which computes the same numbers.
"""

from __future__ import annotations

import ctypes
import logging

import torch
import torch.nn.functional as F
from torch import nn

from zenedge.kernels import native
from zenedge.runtime import cpu_weights
from zenedge.runtime.layers import step_product

log = logging.getLogger("zenedge.runtime")


class FusedStep:
    """A decode step of every layer as one C call (kernels/native/decode_step.c): the same kernels, in
    the same order, with the same roundings as `LeanLlama._decode`, without its torch ops and Python
    calls per layer. Built per request (and per change of its rows) where every product is a
    C-kernel int4 copy (the base's for every row, or a hot BitDelta's dense one where it serves
    every row) plus each row's variant as LoRA slices or packed 1-bit sign slices, with no bias,
    the norms, attention and SiLU run in C, and the model is fp32; else None and `_decode` runs
    (`c_step_fallback` says why)."""

    def __init__(self, kernel, layers, shape, keep, copies):
        self.kernel, self.layers, self.shape = kernel, layers, shape
        self.keep = keep                  # the tensors the structures point into
        # [(BitDeltaModule, its dense copy when the step was built: the one the structures read, or
        # None for a packed delta read through its signs)]: the step holds while these still hold
        self.copies = copies
        self.cache = None                 # the KV views the structures point into (this step's)

    @classmethod
    def build(cls, model: nn.Module, lean, batch) -> "FusedStep | None":
        """The C step for `lean` (a lean_llama.LeanLlama of `model`) serving `batch`, or None."""
        weight = lean.embed.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or not lean.layers:
            return None                  # (checked first: a CUDA model never builds the CPU kernels)
        kernel = native.decode_step()
        if kernel is None:
            return None                  # (the decode path reports why the kernels are off)
        keep, copies = [], []
        layers = (native.Layer * len(lean.layers))()
        refused = cls._fill(model, lean, batch, layers, keep, copies)
        _remember_fallback(model, refused)
        if refused is not None:
            return None
        first = lean.layers[0]
        shape = native.Shape(weight.shape[1], first[6], first[7], first[8], first[11].weight.shape[0], first[9])
        return cls(kernel, layers, shape, keep, copies)

    @staticmethod
    def _fill(model, lean, batch, layers, keep: list, copies: list) -> str | None:
        """Fill the layers' structures; why the C step cannot run this batch, or None."""
        first, weight = lean.layers[0], lean.embed.weight
        heads, kv_heads, dim, scaling, intermediate = first[6], first[7], first[8], first[9], first[11].weight.shape[0]
        if native.decode_attention_fn(heads, kv_heads, dim, scaling, weight.dtype, weight.device) is None:
            return f"attention of {heads} heads over {kv_heads} of {dim}: not the C kernel's shape"
        for (i, _, q, k, v, o, h, h_kv, d, s, _, gate, up, down, act), layer, entry in zip(
                lean.layers, list(model.model.layers), layers):
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            if (h, h_kv, d, s) != (heads, kv_heads, dim, scaling) or act is not F.silu \
                    or up.weight.shape[0] != intermediate \
                    or any(n.weight.dtype != torch.float32 or n.weight.dim() != 1 for n in norms):
                return f"layer {i} differs from the first, or its activation is not SiLU"
            for name, linears in (("qkv", (q, k, v)), ("o", (o,)), ("gate_up", (gate, up)), ("down", (down,))):
                refused = _describe(getattr(entry, name), linears, batch, keep, copies)
                if refused is not None:
                    return f"layer {i} {name}: {refused}"
            entry.norm1, entry.norm2 = (n.weight.detach().data_ptr() for n in norms)
            entry.eps1, entry.eps2 = (n.variance_epsilon for n in norms)
        keep += [layer.input_layernorm.weight for layer in model.model.layers]
        keep += [layer.post_attention_layernorm.weight for layer in model.model.layers]
        return None

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, view) -> bool:
        """Run the step on x [n, hidden] in place; False (nothing done) where it cannot: a dense
        copy dropped or replaced since the request began, a cache laid out otherwise."""
        if view.host_lengths is None or any(delta.dense is not copy for delta, copy in self.copies):
            return False
        keys, values = view.layers[0][1], view.layers[0][2]
        n, length = x.shape[0], keys.shape[2]
        layout = (len(view.layers), keys.data_ptr(), values.data_ptr(), keys.stride())
        if layout != self.cache:
            if not self._point_at(view):
                return False
            self.cache = layout
        if not (x.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
                and x.dtype == cos.dtype == sin.dtype == torch.float32 and keys.shape[0] == n
                and view.positions.dtype == view.lengths.dtype == torch.int64):
            return False
        status = self.kernel(x.data_ptr(), n, self.layers, len(self.layers), ctypes.byref(self.shape), cos.data_ptr(),
                             sin.data_ptr(), view.positions.data_ptr(), view.lengths.data_ptr(), length)
        if status:
            raise RuntimeError(f"the C decode step failed (status {status})")
        return True

    def _point_at(self, view) -> bool:
        """Point every layer's structure at this step's cache views (D contiguous, positions D
        apart, keys and values alike, as the attention kernel reads them)."""
        if len(view.layers) != len(self.layers):
            return False
        for entry, (_, keys, values) in zip(self.layers, view.layers):
            strides = keys.stride()
            if keys.dtype != torch.float32 or values.stride() != strides or strides[2:] != (self.shape.dim, 1) \
                    or values.dtype != torch.float32 or keys.shape[1] != self.shape.kv_heads:
                return False
            entry.keys, entry.values = keys.data_ptr(), values.data_ptr()
            entry.strides[:] = strides[:3]
        return True


def _describe(entry, linears, batch, keep: list, copies: list) -> str | None:
    """Fill a native.Product with what the Python step multiplies `linears` by for a decode step
    of `batch` (layers.step_product: their int4 copies stacked, each variant's LoRA and sign slices
    on its rows); why the C step cannot do the same, or None."""
    step = step_product(linears, batch)
    if step is None:
        return "a bias, a dense BitDelta copy beside other rows' variants, or a delta no C kernel takes"
    if type(step.weight) is not cpu_weights.NativeInt4Weight:
        return "its weights are not the C int4 kernel's"
    if any(len(d.loras) > native.MAX_SLICES or len(d.signs) > native.MAX_SLICES for d in step.deltas):
        return f"a variant adds more than {native.MAX_SLICES} slices"
    tensors, pointers = step.weight._weights
    entry.codes, entry.scale, entry.zero = pointers
    entry.kind = step.weight.kind
    entry.rows, entry.inputs = step.weight.rows, step.weight.inputs
    keep.extend(tensors)
    deltas = (native.Delta * max(len(step.deltas), 1))()
    for slot, delta in zip(deltas, step.deltas):
        if delta.rows is not None:
            rows = delta.rows.to(torch.int64).contiguous()
            keep.append(rows)
            slot.rows, slot.count = rows.data_ptr(), rows.numel()
        slot.loras, slot.signs = len(delta.loras), len(delta.signs)
        for lora, (offset, width, factors) in zip(slot.lora, delta.loras):
            if native.lora_add_fn(factors.A, factors.B.t(), factors.scale) is None:
                return f"a LoRA of rank {factors.A.shape[0]} the C kernel does not take"
            a, b_t = factors.A.detach().contiguous(), factors.B.detach().t().contiguous()
            keep += [a, b_t]
            lora.a, lora.bt, lora.rank, lora.scale = a.data_ptr(), b_t.data_ptr(), a.shape[0], factors.scale
            lora.offset, lora.width = offset, width
        for sign, (offset, width, module) in zip(slot.sign, delta.signs):
            by_input, alpha = module.packed.t().contiguous(), module.alpha.contiguous()   # sign_add.c's [K/8, N]
            keep += [by_input, alpha]
            sign.signs, sign.alpha, sign.offset, sign.width = by_input.data_ptr(), alpha.data_ptr(), offset, width
    keep.append(deltas)
    entry.deltas, entry.delta = len(step.deltas), deltas
    copies.extend(step.hot)
    signs = [module for delta in step.deltas for _, _, module in delta.signs]
    copies.extend((module, None) for module in signs)    # packed: valid while no dense copy replaces it
    return None


_FALLBACK_ATTR = "_zenedge_c_step_fallback"
_logged_fallbacks: set[str] = set()


def _remember_fallback(model: nn.Module, reason: str | None) -> None:
    """Keep why the latest batch on `model` ran the Python step (None: the C step), for the decode
    path's report (decode.decode_path: doctor, /api/ps); log each reason once per process. Never
    an error: the Python step computes the same numbers."""
    setattr(model, _FALLBACK_ATTR, reason)
    if reason is not None and reason not in _logged_fallbacks:
        _logged_fallbacks.add(reason)
        log.info("a decode batch runs the Python step, not the one-call C step: %s", reason)


def c_step_fallback(model: nn.Module) -> str | None:
    """Why the latest decode batch on `model` ran the Python step instead of the C step, or None."""
    return getattr(model, _FALLBACK_ATTR, None)
