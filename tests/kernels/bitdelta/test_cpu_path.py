"""The torch path (no CUDA): exact against the float64 reference, chunked, and the cached forms."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import zenedge.kernels.bitdelta as kernels
from zenedge.bitdelta.packing import unpack_signs
from zenedge.kernels.bitdelta import cpu, reference

from .helpers import TOLERANCE, poisoned, problem, relative_error


@pytest.mark.parametrize("m", [1, 3, 8, 9, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_path_matches_reference(m, dtype):
    x, weight, packed, alpha, bias = problem(m, 70, 93, dtype, seed=m, bias=True)
    out = poisoned(m, 70, dtype)
    y = cpu.bitdelta_linear(x, weight, packed, alpha, bias, out=out)
    expected = reference.bitdelta_linear(x.double(), weight.double(), packed, alpha.double(), bias.double())
    assert y is out
    assert relative_error(y, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("m", [1, 12, 40])
def test_chunking_over_output_rows_changes_nothing(m, monkeypatch):
    x, weight, packed, alpha, _ = problem(m, 50, 64, torch.float32, seed=2)
    whole = cpu.bitdelta_linear(x, weight, packed, alpha)
    monkeypatch.setattr(cpu, "_CHUNK_ELEMENTS", 64 * 7)          # 7 rows per chunk, ragged last chunk
    assert torch.allclose(cpu.bitdelta_linear(x, weight, packed, alpha), whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("m", [1, 5, 30])
def test_cpu_multi_matches_reference(m):
    x, weight, packed, alpha, bias = problem(m, 40, 72, torch.float32, deltas=3, seed=m, bias=True)
    ids = torch.randint(-1, 3, (m,), generator=torch.Generator().manual_seed(m))
    y = cpu.bitdelta_linear_multi(x, weight, packed, alpha, ids, bias, out=poisoned(m, 40, torch.float32))
    expected = reference.bitdelta_linear_multi(x.double(), weight.double(), packed, alpha.double(), ids,
                                               bias.double())
    assert relative_error(y, expected) < 1e-5


def test_cached_forms_give_the_same_result():
    x, weight, packed, alpha, bias = problem(4, 33, 77, torch.float32, seed=4, bias=True)
    expected = reference.bitdelta_linear(x.double(), weight.double(), packed, alpha.double(), bias.double())
    dense = cpu.reconstruct_weight(weight, packed, alpha)
    assert torch.allclose(dense, weight + alpha[:, None] * unpack_signs(packed, 77), atol=1e-6)
    assert relative_error(torch.nn.functional.linear(x, dense, bias), expected) < 1e-5


def test_reconstruct_does_not_touch_the_base_weight():
    x, weight, packed, alpha, _ = problem(20, 16, 24, torch.float32, seed=8)
    before = weight.clone()
    cpu.reconstruct_weight(weight, packed, alpha)
    cpu.bitdelta_linear(x, weight, packed, alpha)                # prefill path rebuilds W_hat chunks
    assert torch.equal(weight, before)


def test_package_dispatch_uses_the_torch_path_on_cpu():
    x, weight, packed, alpha, _ = problem(6, 24, 40, torch.float32, seed=3)
    y = kernels.bitdelta_linear(x.view(2, 3, 40), weight, packed, alpha)
    expected = reference.bitdelta_linear(x.double(), weight.double(), packed, alpha.double())
    assert y.shape == (2, 3, 24) and relative_error(y.reshape(6, 24), expected) < 1e-5
    ids = torch.tensor([0, -1, 1, 1, 0, -1])
    packed2, alpha2 = torch.stack([packed, packed.flip(0)]), torch.stack([alpha, alpha * 2])
    y2 = kernels.bitdelta_linear_multi(x, weight, packed2, alpha2, ids)
    expected2 = reference.bitdelta_linear_multi(x.double(), weight.double(), packed2, alpha2.double(), ids)
    assert relative_error(y2, expected2) < 1e-5


def test_importing_the_package_is_cheap():
    code = ("import sys, zenedge.kernels, zenedge.kernels.bitdelta;"
            "print(' '.join(m for m in ('torch', 'triton') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == ""
