"""The model transforms, applied from outside to a plain transformers model (as gpt-fast's
quantize.py swaps linears before the load): `patch_model` makes the target linears of the decoder
layers VariantLinear (per-row variants, layers.py), and `convert_model` gives them, and the output
head, fast CPU copies of their weights (cpu_weights.py). The model's own code never changes.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from zenedge.runtime import cpu_weights
from zenedge.runtime.layers import FastLinear, VariantLinear, VariantState

# The output head's format for each model format (see cpu_weights.OneDnnBF16, NativeInt8Weight).
HEAD_FORMATS = {"int8": "bf16", "int4": "q8"}

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


def convert_model(model: nn.Module, fmt: str, *, drop_plain: bool = False, copies: dict | None = None) -> None:
    """Give every VariantLinear a fast copy of its base weight in `fmt` (unless it has one: a
    quantized load made it) and wrap the other linears (the output head) in FastLinear: bf16
    when `fmt` is int8, Q8_0 (or bf16) when int4. `drop_plain`: the
    linears keep no plain weight beside a lossy copy (the head neither, unless it is tied to the
    embedding, which the model reads anyway): the copy is the weight (layers.plain_weight).
    `copies`: {name: copy} made already (a resident file's), used instead of new ones."""
    state = next((m.state for m in model.modules() if isinstance(m, VariantLinear)), None)
    made, copies = copies or {}, {}
    tied = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    for name, module in list(model.named_modules()):
        if isinstance(module, VariantLinear):
            if module.fast is None and module.keeps_plain:
                module.fast = cpu_weights.fast_copy(module.base.weight, fmt)
                if drop_plain and module.fast is not None and module.fast.lossy:
                    module.base.weight = _on_meta(module.base.weight)
            copies[name] = module.fast
        elif type(module) is nn.Linear:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            if isinstance(parent, VariantLinear):            # a VariantLinear's own base: done above
                continue
            fast = copies[name] = made.get(name) or cpu_weights.fast_copy(module.weight, HEAD_FORMATS.get(fmt, fmt))
            if fast is not None:
                setattr(parent, child, FastLinear(module, fast, state))
                if drop_plain and fast.lossy and id(module.weight) not in tied:
                    module.weight = _on_meta(module.weight)
    cpu_weights.settle({name: copy for name, copy in copies.items() if copy is not None})
    if state is not None:   # every product of a decode step in the C kernels: steps need one thread
        natives = (cpu_weights.NativeInt4Weight, cpu_weights.NativeInt8Weight)
        state.native_steps = bool(copies) and all(isinstance(copy, natives) for copy in copies.values())


def _on_meta(weight: torch.Tensor) -> nn.Parameter:
    """The parameter's shape and dtype without its bytes (what transformers peeks at)."""
    return nn.Parameter(weight.to("meta"), requires_grad=False)
