"""One kernel config compiled for sm_90a without a GPU: no spills, 16-byte loads, wgmma."""

from __future__ import annotations

import pytest

pytest.importorskip("triton.backends.nvidia")

from tools.gpu.sass import compile_reports, format_table  # noqa: E402
from zenedge.kernels.bitdelta.configs import DECODE_CONFIGS  # noqa: E402


def test_decode_config_compiles_clean_for_sm90a():
    (report,) = compile_reports([("decode", "decode", False, 1, DECODE_CONFIGS[0])], workers=1)
    assert report.spills == 0
    assert report.hgmma > 0 and report.hmma == 0
    assert report.wide_loads > 0
    assert "clean (no spills, every dot on HGMMA): yes" in format_table([report])
