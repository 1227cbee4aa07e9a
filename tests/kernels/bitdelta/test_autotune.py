"""Which kernel configs autotune may time on a GPU (the shape rules themselves are configs.py's)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from zenedge.kernels.bitdelta import autotune


def test_split_k_is_left_out_when_the_environment_says_so_even_after_import(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    monkeypatch.delenv("ZENEDGE_KERNEL_NO_SPLIT_K", raising=False)
    cuda = torch.device("cuda")
    assert {cfg.split_k for cfg in autotune.candidates(1, 8192, 4096, cuda)} == {1, 2, 4, 8}
    monkeypatch.setenv("ZENEDGE_KERNEL_NO_SPLIT_K", "1")
    assert {cfg.split_k for cfg in autotune.candidates(1, 8192, 4096, cuda)} == {1}
