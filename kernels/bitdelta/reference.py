"""Torch references for the fused kernels: the spec, same signatures, plain and slow.

They materialise W + α⊙S and compute in float64, then return x's dtype (pass float64 inputs to
get the exact float64 result the tests compare against).
"""

from __future__ import annotations

import torch

from zenedge.bitdelta.packing import unpack_signs


def bitdelta_linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """x[M, in] · (W[out, in] + alpha[out] ⊙ S[out, in])ᵀ (+ bias[out]) -> [M, out] in x.dtype."""
    in_features = weight.shape[1]
    signs = unpack_signs(packed, in_features, dtype=torch.float64)
    w_hat = weight.double() + alpha.double()[:, None] * signs
    y = x.double() @ w_hat.T
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)


def bitdelta_linear_multi(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor,
                          delta_ids: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Row m uses delta ``delta_ids[m]`` (packed [D, out, in/8], alpha [D, out]); id -1 = base only."""
    in_features = weight.shape[1]
    y = x.double() @ weight.double().T
    for d in range(packed.shape[0]):
        rows = (delta_ids == d).nonzero().flatten()
        if rows.numel() == 0:
            continue
        signs = unpack_signs(packed[d], in_features, dtype=torch.float64)
        y[rows] += (x[rows].double() @ signs.T) * alpha[d].double()
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype)
