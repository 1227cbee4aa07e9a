"""Scale distillation (BitDelta §3.2): train only the alphas, signs frozen, to match logits.

A copy of the base model gets every compressed nn.Linear swapped for ``ScaledSignLinear``
(x·Wᵀ + α ⊙ (x·Sᵀ)) and the changed full tensors from the file. The loss is MSE between the
fine-tuned model's logits and the 1-bit model's. This is a training-time transform only; serving
uses the fused kernels.

What is trained is log(α/α₀) per row, not α itself: Adam's step size is about `lr` whatever the
gradient's scale, and α is ~4e-4 for a 135M model's fine-tune, so the paper's lr = 1e-4 applied
to α directly moved it by a quarter per step and drove some rows negative (seen on math-full:
logit MSE 0.047 → 0.50). In log space `lr` is a relative step, α stays positive, and the result
is kept only if it lowers the calibration loss.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .fileformat import BitDeltaFile
from .packing import unpack_signs


class ScaledSignLinear(nn.Module):
    """y = x·Wᵀ + α ⊙ (x·Sᵀ) + b with W, S frozen buffers and α [out] trainable."""

    def __init__(self, linear: nn.Linear, packed: torch.Tensor, alpha: torch.Tensor):
        super().__init__()
        weight = linear.weight.detach()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", linear.bias.detach() if linear.bias is not None else None)
        self.register_buffer("signs", unpack_signs(packed.to(weight.device), weight.shape[1], dtype=weight.dtype))
        self.register_buffer("alpha0", alpha.detach().to(device=weight.device, dtype=torch.float32).clone())
        self.log_scale = nn.Parameter(torch.zeros_like(self.alpha0))  # α = α₀·exp(log_scale)

    @property
    def alpha(self) -> torch.Tensor:
        return self.alpha0 * self.log_scale.exp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight, self.bias)
        return base + F.linear(x, self.signs) * self.alpha.to(x.dtype)


@dataclass(frozen=True)
class DistillResult:
    alphas: dict[str, torch.Tensor]     # module name -> trained fp32 alpha [out] (CPU)
    loss_before: float                  # mean logit MSE over the calibration batches, initial alphas
    loss_after: float                   # the same after training
    steps: int


def apply_bitdelta(base_model: nn.Module, bitdelta: BitDeltaFile) -> nn.Module:
    """A deep copy of ``base_model`` with the 1-bit delta applied as ScaledSignLinear modules."""
    model = copy.deepcopy(base_model)
    for name, (packed, alpha, _in_features) in bitdelta.modules.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, child)
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"{name} is a {type(linear).__name__}, not an nn.Linear")
        setattr(parent, child, ScaledSignLinear(linear, packed, alpha))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in bitdelta.extra.items():
            if name not in params:
                raise ValueError(f"extra tensor {name} has no parameter in the model")
            params[name].copy_(tensor.to(params[name].dtype))
    for p in model.parameters():
        p.requires_grad_(False)
    for module in model.modules():
        if isinstance(module, ScaledSignLinear):
            module.log_scale.requires_grad_(True)
    return model


def _inputs(batch) -> dict:
    if isinstance(batch, torch.Tensor):
        return {"input_ids": batch}
    return dict(batch)


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _mean_loss(student: nn.Module, teacher_logits: list[torch.Tensor], batches: list[dict]) -> float:
    with torch.no_grad():
        losses = [F.mse_loss(student(**b).logits.float(), t).item() for b, t in zip(batches, teacher_logits)]
    return sum(losses) / len(losses)


def distill_scales(base_model: nn.Module, finetuned_model: nn.Module, bitdelta_file: BitDeltaFile,
                   calibration_batches: Iterable, steps: int, lr: float = 1e-3, *,
                   device: str | torch.device | None = None) -> DistillResult:
    """Train the alphas of ``bitdelta_file`` so base + α⊙S matches ``finetuned_model``'s logits.

    calibration_batches: tensors of input_ids [B, T] or dicts of model inputs (see calibration.py);
    they are cycled for ``steps`` Adam steps on log α (``lr`` is a relative step). Returns the new
    alphas and the loss before/after; if training did not lower the loss, the initial alphas.
    """
    device = torch.device(device) if device is not None else next(base_model.parameters()).device
    batches = [_to(_inputs(b), device) for b in calibration_batches]
    if not batches:
        raise ValueError("distill_scales needs at least one calibration batch")
    student = apply_bitdelta(base_model, bitdelta_file).to(device).eval()
    teacher = finetuned_model.to(device).eval()
    with torch.no_grad():
        teacher_logits = [teacher(**b).logits.float() for b in batches]
    loss_before = _mean_loss(student, teacher_logits, batches)

    scaled = {name: m for name, m in student.named_modules() if isinstance(m, ScaledSignLinear)}
    optimizer = torch.optim.Adam([m.log_scale for m in scaled.values()], lr=lr)
    for step, (batch, target) in zip(range(steps), itertools.cycle(zip(batches, teacher_logits))):
        optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(student(**batch).logits.float(), target)
        loss.backward()
        optimizer.step()
    loss_after = _mean_loss(student, teacher_logits, batches)
    if loss_after >= loss_before:  # never hand back scales that fit the fine-tune worse
        return DistillResult(alphas={n: m.alpha0.cpu().clone() for n, m in scaled.items()},
                             loss_before=loss_before, loss_after=loss_before, steps=steps)
    alphas = {name: m.alpha.detach().float().cpu().clone() for name, m in scaled.items()}
    return DistillResult(alphas=alphas, loss_before=loss_before, loss_after=loss_after, steps=steps)


def with_alphas(bitdelta_file: BitDeltaFile, alphas: dict[str, torch.Tensor]) -> BitDeltaFile:
    """A copy of ``bitdelta_file`` whose modules carry ``alphas`` (e.g. from distill_scales)."""
    modules = dict(bitdelta_file.modules)
    for name, alpha in alphas.items():
        packed, old, in_features = modules[name]
        if alpha.shape != old.shape:
            raise ValueError(f"{name}: new alpha {tuple(alpha.shape)} != {tuple(old.shape)}")
        modules[name] = (packed, alpha.to(torch.float32).contiguous(), in_features)
    return BitDeltaFile(modules=modules, extra=dict(bitdelta_file.extra), metadata=dict(bitdelta_file.metadata))
