"""Benchmark baselines: the published BitDelta serving design and the naive path, written anew.

Published design (REFERENCES.md): signs packed 32 per int32 along the input dim; the base GEMM,
a Triton delta GEMM (16-row tile at decode), the α multiply and the add are separate launches;
several deltas run one after another. Naive path: unpack S, materialise W + α⊙S, dense linear.
Neither is meant for serving; they exist so the fused kernel's ratios are measured, not quoted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from zenedge.bitdelta.packing import unpack_signs


@triton.jit
def _sign_gemm_kernel(x_ptr, s_ptr, out_ptr, M, N, K, KW, stride_xm, stride_sn, stride_om,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[M, N] = x[M, K] · S[N, K]ᵀ, S from int32 words (bit i of word q = element 32q + i)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_i = tl.arange(0, 32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        offs_w = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        words = tl.load(s_ptr + offs_n[:, None] * stride_sn + offs_w[None, :],
                        mask=(offs_n[:, None] < N) & (offs_w[None, :] < KW), other=0)
        bits = (words[:, :, None] >> offs_i[None, None, :]) & 1                  # [BN, BK/32, 32]
        signs = tl.reshape(tl.where(bits != 0, 1.0, -1.0), [BLOCK_N, BLOCK_K]).to(x.dtype)
        acc = tl.dot(x, tl.trans(signs), acc)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def sign_gemm(x: torch.Tensor, packed32: torch.Tensor, in_features: int) -> torch.Tensor:
    """fp32 [M, N] = x · Sᵀ; packed32 int32 [N, ceil(in/32)]. 16-row tiles, as published."""
    m, n = x.shape[0], packed32.shape[0]
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, 16), triton.cdiv(n, 64))
    _sign_gemm_kernel[grid](x, packed32, out, m, n, in_features, packed32.shape[1], x.stride(0),
                            packed32.stride(0), out.stride(0), BLOCK_M=16, BLOCK_N=64, BLOCK_K=128,
                            num_warps=4, num_stages=3)
    return out


def as_int32_words(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., N, KB] -> int32 [..., N, KB/4]; LSB-first bytes make LSB-first words (little endian)."""
    if packed.shape[-1] % 4:
        raise ValueError("int32 words need in_features to be a multiple of 32")
    return packed.contiguous().view(torch.int32)


def published_linear(x, weight, packed32, alpha, bias=None):
    """Separate launches: base GEMM, delta GEMM, α multiply, add."""
    base = F.linear(x, weight, bias)
    delta = sign_gemm(x, packed32, weight.shape[1])
    delta.mul_(alpha)
    return base.add_(delta.to(base.dtype))


def published_linear_multi(x, weight, packed32, alpha, row_sets, bias=None):
    """One base GEMM, then per delta (row_sets[d] = its rows, precomputed) its own launches."""
    y = F.linear(x, weight, bias)
    for d, rows in enumerate(row_sets):
        if rows is None:
            continue
        delta = sign_gemm(x.index_select(0, rows), packed32[d], weight.shape[1])
        delta.mul_(alpha[d])
        y.index_add_(0, rows, delta.to(y.dtype))
    return y


def naive_linear(x, weight, packed, alpha, bias=None):
    """Unpack S, materialise W + α⊙S in the weight dtype, one dense linear."""
    signs = unpack_signs(packed, weight.shape[1], dtype=weight.dtype)
    w_hat = torch.addcmul(weight, signs, alpha[:, None].to(weight.dtype))
    return F.linear(x, w_hat, bias)


def naive_linear_multi(x, weight, packed, alpha, row_sets, bias=None):
    y = F.linear(x, weight, bias)
    for d, rows in enumerate(row_sets):
        if rows is not None:
            y.index_copy_(0, rows, naive_linear(x.index_select(0, rows), weight, packed[d], alpha[d], bias))
    return y
