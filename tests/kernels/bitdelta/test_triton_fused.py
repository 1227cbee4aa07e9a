"""The fused Triton kernel (interpreted on CPU) against the float64 reference.

bf16 is covered by the CPU-path tests and the GPU check only: the Triton 3.9 interpreter stores
bf16 as uint16 and computes on the integers, so its bf16 results are meaningless.
"""

from __future__ import annotations

import pytest
import torch

from zenedge.kernels.bitdelta import reference
from zenedge.kernels.bitdelta.configs import INTERPRET_DECODE, KernelConfig
from zenedge.kernels.bitdelta.grouping import group_rows
from zenedge.kernels.bitdelta.launch import KernelArgumentError
from zenedge.kernels.bitdelta.triton import bitdelta_linear, bitdelta_linear_multi

from .helpers import TOLERANCE, poisoned, problem, relative_error

SHAPES = [  # (M, out, in): out/in off the block sizes, decode and prefill M. Sign rows of whole
    # 32-bit words (in = 61, 128, 192: read as int32) and of loose bytes (72, 75, 200), with
    # in a multiple of the K step (128, 192: no K masks) or not.
    (1, 40, 72), (3, 40, 75), (16, 33, 61), (2, 40, 128), (17, 130, 200), (70, 72, 192), (300, 130, 200),
]


def _single_ref(x, weight, packed, alpha, bias):
    return reference.bitdelta_linear(x.double(), weight.double(), packed, alpha.double(),
                                     None if bias is None else bias.double())


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_single_delta_matches_reference(m, n, k, dtype):
    x, weight, packed, alpha, bias = problem(m, n, k, dtype, seed=m + n + k, bias=(m % 2 == 1))
    out = poisoned(m, n, dtype)
    y = bitdelta_linear(x, weight, packed, alpha, bias, out=out)
    assert y.data_ptr() == out.data_ptr()
    assert relative_error(y, _single_ref(x, weight, packed, alpha, bias)) < TOLERANCE[dtype]


@pytest.mark.parametrize("split_k", [1, 2, 3])
def test_decode_split_k_matches_reference_and_reuses_workspace(split_k):
    cfg = KernelConfig(block_n=16, block_m=16, block_k=32, split_k=split_k)
    x, weight, packed, alpha, bias = problem(2, 37, 70, torch.float32, seed=split_k, bias=True)
    expected = _single_ref(x, weight, packed, alpha, bias)
    for _ in range(2):   # the second launch only passes if the first re-zeroed the workspace
        y = bitdelta_linear(x, weight, packed, alpha, bias, out=poisoned(2, 37, torch.float32), config=cfg)
        assert relative_error(y, expected) < 1e-5


def test_leading_dims_are_flattened():
    x, weight, packed, alpha, _ = problem(6, 24, 40, torch.float32, seed=3)
    y = bitdelta_linear(x.view(2, 3, 40), weight, packed, alpha)
    assert y.shape == (2, 3, 24)
    assert relative_error(y.reshape(6, 24), _single_ref(x, weight, packed, alpha, None)) < 1e-5


def _ids(m: int, deltas: int, seed: int) -> torch.Tensor:
    """Random ids in [-1, deltas) with delta 1 never used (an empty segment)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1, deltas, (m,), generator=gen)
    return torch.where(ids == 1, torch.full_like(ids, 2), ids)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grouped_deltas_match_reference(m, n, k, dtype):
    deltas = 4
    x, weight, packed, alpha, bias = problem(m, n, k, dtype, deltas=deltas, seed=m * 7 + k, bias=(m > 3))
    ids = _ids(m, deltas, seed=m)
    y = bitdelta_linear_multi(x, weight, packed, alpha, ids, bias, out=poisoned(m, n, dtype))
    expected = reference.bitdelta_linear_multi(x.double(), weight.double(), packed, alpha.double(), ids,
                                               None if bias is None else bias.double())
    assert relative_error(y, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("ids", [
    [-1, -1, -1],                       # base only: no bits read at all
    [2, 2, 2, 2, 2],                    # one delta, others empty
    [0, 3, -1, 3, 0, 2, -1, 3, 0],      # every segment boundary mid-tile
])
def test_grouped_edge_cases(ids):
    ids = torch.tensor(ids)
    m = ids.shape[0]
    x, weight, packed, alpha, _ = problem(m, 29, 45, torch.float32, deltas=4, seed=m)
    expected = reference.bitdelta_linear_multi(x.double(), weight.double(), packed, alpha.double(), ids)
    configs = (INTERPRET_DECODE,                                     # slots: 8 per program, split K
               KernelConfig(block_n=16, block_m=16, block_k=128),    # slots: 2 per program, 1-2 groups
               KernelConfig(block_n=16, block_m=4, block_k=32))      # tiles
    for cfg in configs:
        y = bitdelta_linear_multi(x, weight, packed, alpha, ids, out=poisoned(m, 29, torch.float32), config=cfg)
        assert relative_error(y, expected) < 1e-5


def test_precomputed_grouping_is_reused():
    x, weight, packed, alpha, _ = problem(20, 24, 48, torch.float32, deltas=3, seed=5)
    ids = _ids(20, 3, seed=9)
    grouping = group_rows(ids, 3)
    y = bitdelta_linear_multi(x, weight, packed, alpha, grouping=grouping)
    expected = reference.bitdelta_linear_multi(x.double(), weight.double(), packed, alpha.double(), ids)
    assert relative_error(y, expected) < 1e-5


@pytest.mark.parametrize("bad", ["dtype", "packed", "alpha", "layout"])
def test_launcher_rejects_bad_inputs(bad):
    x, weight, packed, alpha, _ = problem(2, 16, 32, torch.float32)
    if bad == "dtype":
        weight = weight.half()
    elif bad == "packed":
        packed = packed[:, :-1].contiguous()
    elif bad == "alpha":
        alpha = alpha.double()
    else:
        weight = weight.T.contiguous().T
    with pytest.raises(KernelArgumentError):
        bitdelta_linear(x, weight, packed, alpha)


@pytest.mark.parametrize("m,deltas", [(14, 12), (16, 16)])
def test_decode_batch_with_many_distinct_deltas_is_one_launch(m, deltas):
    # Up to one slot per row (16 = MAX_DECODE_SLOTS): each delta's bits are read once, exact.
    x, weight, packed, alpha, bias = problem(m, 40, 64, torch.float32, deltas=deltas, seed=11, bias=True)
    ids = torch.arange(m) % deltas
    ids[-1] = -1 if m > deltas else ids[-1]
    y = bitdelta_linear_multi(x, weight, packed, alpha, ids, bias, out=poisoned(m, 40, torch.float32))
    expected = reference.bitdelta_linear_multi(x.double(), weight.double(), packed, alpha.double(), ids,
                                               bias.double())
    assert relative_error(y, expected) < 1e-5
