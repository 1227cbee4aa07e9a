"""`zenedge bench load`'s pieces: the busy processes it holds, and the ratios and table it reports."""

from __future__ import annotations

import psutil

from zenedge.bench.load import background_load, describe
from zenedge.bench.under_load import _ratios, table


def test_background_load_holds_busy_processes_and_stops_them():
    with background_load(2) as busy:
        assert len(busy) == 2
        assert all(process.poll() is None for process in busy)
        pids = [process.pid for process in busy]
        assert all(psutil.Process(pid).cpu_times().user >= 0 for pid in pids)
    assert all(process.poll() is not None for process in busy)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    with background_load(0) as none:
        assert none == []


def test_ratios_compare_busy_with_quiet_and_auto_with_one_thread():
    row = lambda decode, seconds: {"decode_tokens_per_s": decode, "prefill_tokens_per_s": 100.0,
                                   "gate_rows_per_s": 5.0, "import_seconds": seconds}
    medians = {f"{describe(0)}, threads auto": row(100.0, 10.0), f"{describe(0)}, threads 1": row(80.0, 15.0),
               f"{describe(1)}, threads auto": row(95.0, 12.0), f"{describe(1)}, threads 1": row(90.0, 14.0)}
    ratios = _ratios(medians, 1)
    assert ratios["busy_vs_quiet"]["decode_tokens_per_s"] == 0.95
    assert ratios["busy_vs_quiet"]["import_seconds"] == 1.2          # a time ratio: the "≤ 1.5×"
    assert ratios["auto_vs_one_thread_quiet"]["decode_tokens_per_s"] == 1.25
    assert ratios["auto_vs_one_thread_quiet"]["import_seconds"] == 1.5   # a speed-up
    text = table({"date": "2026-12-02", "machine": {"cpu": "cpu", "cores": 2}, "rounds": 1, "medians": medians,
                  "ratios": ratios})
    assert "| merging import, s | 10 | 15 | 12 | 14 | 1.20× | 1.50× |" in text
