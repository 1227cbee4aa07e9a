"""The ±1 tile the kernels build from sign words, bit for bit, in every 16-bit dtype and layout.

The fused kernels never see bf16 arithmetic under the interpreter (it computes bf16 on integers),
so this checks the bit patterns directly: the tile, read back as int16, must equal the dtype's
±1.0 bits of zenedge.bitdelta.unpack_signs. The PRMT form (GPU only: inline PTX) is checked by
emulating the instruction on the same words.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from zenedge.bitdelta.packing import pack_signs, unpack_signs
from zenedge.kernels.bitdelta.fused_kernel import _sign_tile


@triton.jit
def _sign_bits_kernel(words_ptr, out_ptr, ROWS: tl.constexpr, K: tl.constexpr, DTYPE: tl.constexpr,
                      LANES: tl.constexpr):
    rows = tl.arange(0, ROWS)
    words = tl.load(words_ptr + rows[:, None] * (K // 32) + tl.arange(0, K // 32)[None, :])
    s = _sign_tile(words, ROWS, K, DTYPE, LANES, False)
    tl.store(out_ptr + rows[:, None] * K + tl.arange(0, K)[None, :], s.to(tl.int16, bitcast=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lanes", [True, False])
def test_sign_tile_bits_match_unpacked_signs(dtype, lanes):
    rows, k = 4, 64
    delta = torch.randn(rows, k, generator=torch.Generator().manual_seed(3))
    packed = pack_signs(delta)
    out = torch.zeros(rows, k, dtype=torch.int16)
    _sign_bits_kernel[(1,)](packed.view(torch.int32), out, ROWS=rows, K=k,
                            DTYPE=tl.bfloat16 if dtype == torch.bfloat16 else tl.float16, LANES=lanes)
    expected = unpack_signs(packed, k).to(dtype).view(torch.int16)
    assert torch.equal(out, expected)


def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    """PTX prmt.b32 (default mode): result byte i = byte (sel >> 4i) & 7 of {b, a}."""
    pool = [(a >> (8 * j)) & 0xFF for j in range(4)] + [(b >> (8 * j)) & 0xFF for j in range(4)]
    return sum(pool[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))


def test_prmt_selector_lifts_the_pair_bits_to_the_sign_bits():
    words = np.random.default_rng(0).integers(0, 1 << 32, size=64, dtype=np.uint64)
    for c in range(4):                      # lane in a quad: bits 2c, 2c+1 of every byte
        even, odd = (words << (7 - 2 * c)) & 0xFFFFFFFF, (words << (6 - 2 * c)) & 0xFFFFFFFF
        for beta in range(4):               # byte of the word
            v = _prmt(even, odd, (beta << 4) | ((beta + 4) << 12))
            assert np.array_equal((v >> 15) & 1, (words >> (8 * beta + 2 * c)) & 1)
            assert np.array_equal((v >> 31) & 1, (words >> (8 * beta + 2 * c + 1)) & 1)
