"""bf16 linears on CPU through oneDNN's pre-packed weights.

A decode step is a chain of matrix-vector products, bound by how fast the weights stream from
memory. bf16 halves the bytes, but torch's plain bf16 F.linear on CPU runs no faster than fp32
(measured on the benchmark machine: a generic kernel converts as it goes). oneDNN's linear on a
weight reordered once into its blocked layout (`mkldnn._reorder_linear_weight`, the op inductor's
freezing pass emits) does run ~1.5× faster than fp32 there, so bf16 residents on CPU keep a packed
copy of every linear weight beside the plain one. The plain tensor stays the model's parameter
(state_dict, BitDelta reconstruction, quality gates read it); the packed one is only for matmuls.
Memory: bf16 plain + packed = the bytes of one fp32 copy.

GPU and fp32 are untouched: this transform applies only to bf16 weights on a CPU with oneDNN bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def packing_available(dtype: torch.dtype, device: torch.device) -> bool:
    """True where `pack` applies: CPU, bf16, a torch built with oneDNN that supports bf16 here."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The oneDNN-blocked copy of a bf16 [out, in] weight, laid out for decode (batch hint 1)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear for a plain or a packed weight: x [..., in] → [..., out]."""
    if not weight.is_mkldnn:
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    y = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return y.view(*x.shape[:-1], y.shape[-1])


class PackedLinear(nn.Module):
    """An nn.Linear that multiplies with a packed copy; `.weight` is still the plain parameter
    (so a tied embedding stays tied)."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base = base
        self.onednn_weight = pack(base.weight)

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.onednn_weight, self.base.bias)


def pack_model(model: nn.Module) -> int:
    """Give every VariantLinear a packed base weight and wrap the other linears (the output
    head) in PackedLinear. Returns the number of weights packed. Call only where
    `packing_available` says so."""
    from zenedge.runtime.layers import VariantLinear

    packed = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, VariantLinear):
            module.onednn_weight = pack(module.base.weight)
            packed += 1
        elif type(module) is nn.Linear:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            if not isinstance(parent, VariantLinear):          # a VariantLinear's own base: done above
                setattr(parent, child, PackedLinear(module))
                packed += 1
    return packed
