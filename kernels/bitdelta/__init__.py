"""zenedge.kernels.bitdelta: y = x·(W + α⊙S)ᵀ (+b) for 1-bit BitDelta deltas, one delta or many per batch.

``bitdelta_linear`` / ``bitdelta_linear_multi`` dispatch on the tensors' device: the fused Triton
kernel (zenedge.kernels.bitdelta.triton) for CUDA tensors, the torch path
(zenedge.kernels.bitdelta.cpu) otherwise.
Importing this package is cheap: torch, triton and the kernels load on first call, and nothing
touches a GPU until then.
"""

from __future__ import annotations

__all__ = ["bitdelta_linear", "bitdelta_linear_multi"]


def bitdelta_linear(x, weight, packed, alpha, bias=None, *, out=None):
    """x[..., in] · (W[out, in] + alpha[out] ⊙ S)ᵀ (+ bias) -> [..., out]; packed uint8 [out, ceil(in/8)]."""
    if x.is_cuda:
        from .triton import bitdelta_linear as fused       # lazy: triton only when a GPU is used
        return fused(x, weight, packed, alpha, bias, out=out)
    from .cpu import bitdelta_linear as torch_path
    lead = x.shape[:-1]
    out2 = out.view(-1, weight.shape[0]) if out is not None else None
    y = torch_path(x.reshape(-1, x.shape[-1]), weight, packed, alpha, bias, out=out2)
    return y.view(*lead, weight.shape[0])


def bitdelta_linear_multi(x, weight, packed, alpha, delta_ids, bias=None, *, out=None):
    """Row m uses delta ``delta_ids[m]`` of packed [D, out, ceil(in/8)] / alpha [D, out]; -1 = base only."""
    if x.is_cuda:
        from .triton import bitdelta_linear_multi as fused
        return fused(x, weight, packed, alpha, delta_ids, bias, out=out)
    from .cpu import bitdelta_linear_multi as torch_path
    lead = x.shape[:-1]
    out2 = out.view(-1, weight.shape[0]) if out is not None else None
    y = torch_path(x.reshape(-1, x.shape[-1]), weight, packed, alpha, delta_ids.reshape(-1), bias, out=out2)
    return y.view(*lead, weight.shape[0])
