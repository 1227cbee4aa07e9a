"""The BitDelta kernels benchmark's baselines compute the same function (else their ratios mean nothing)."""

from __future__ import annotations

import torch

from tests.kernels.bitdelta.helpers import problem, relative_error
from tools.gpu import bitdelta_baselines as published
from zenedge.kernels.bitdelta import reference


def test_published_design_and_naive_path_match_reference():
    x, weight, packed, alpha, bias = problem(5, 70, 96, torch.float32, seed=1, bias=True)
    expected = reference.bitdelta_linear(x.double(), weight.double(), packed, alpha.double(), bias.double())
    words = published.as_int32_words(packed)
    assert relative_error(published.published_linear(x, weight, words, alpha, bias), expected) < 1e-5
    assert relative_error(published.naive_linear(x, weight, packed, alpha, bias), expected) < 1e-5


def test_multi_delta_baselines_match_reference():
    x, weight, packed, alpha, _ = problem(9, 40, 64, torch.float32, deltas=3, seed=2)
    ids = torch.tensor([0, 2, -1, 2, 0, 0, -1, 2, 2])
    rows = [(ids == d).nonzero().flatten() for d in range(3)]
    rows = [r if r.numel() else None for r in rows]
    expected = reference.bitdelta_linear_multi(x.double(), weight.double(), packed, alpha.double(), ids)
    words = published.as_int32_words(packed)
    assert relative_error(published.published_linear_multi(x, weight, words, alpha, rows), expected) < 1e-5
    assert relative_error(published.naive_linear_multi(x, weight, packed, alpha, rows), expected) < 1e-5
