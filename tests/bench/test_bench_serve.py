"""`zenedge bench serve`'s arithmetic on streams timed by hand: aggregate rates, percentiles, the
per-client latency ratio and the [O] targets (the daemon run itself is measured, not tested)."""

import pytest

from zenedge.bench import serve
from zenedge.bench.serve import Stream


def stream(profile, start, first, gap, count, tokens=None):
    return Stream(profile, start, [first + i * gap for i in range(count)], tokens or count)


def test_a_row_compares_clients_together_with_the_same_requests_one_after_another():
    together = [stream("a", 0.0, 0.1, 0.02, 10), stream("b", 0.0, 0.2, 0.03, 10)]
    apart = [stream("a", 5.0, 5.05, 0.01, 10), stream("b", 6.0, 6.05, 0.01, 10)]
    row = serve._row(2, together, apart)
    assert row["tokens"] == 20
    assert row["aggregate_tokens_per_s"] == pytest.approx(20 / (0.2 + 9 * 0.03))      # first start to last token
    assert row["sequential_tokens_per_s"] == pytest.approx(20 / (2 * (0.05 + 9 * 0.01)))
    assert row["first_token_ms"]["p50"] == pytest.approx(150)
    assert row["inter_token_ms"]["alone_p50"] == pytest.approx(10)
    assert row["worst_client_p95_vs_alone"] == pytest.approx(3.0)                    # b: 30 ms against 10


def test_the_targets_read_the_eight_client_row_and_the_table_shows_every_row():
    rows = [dict(serve._row(n, [stream(f"p{i}", 0.0, 0.1, 0.02 * n ** 0.5, 8) for i in range(n)],
                            [stream(f"p{i}", 0.0, 0.1, 0.02, 8) for i in range(n)]), aggregate_vs_one_client=r)
            for n, r in ((1, 1.0), (8, 3.6))]
    result = {"date": "2026-12-02", "machine": {"cpu": "test cpu", "cores": 2}, "tokens": 8, "rows": rows,
              "profiles": {"lora": 6, "bitdelta": 2}}
    checks = {t["name"]: t for t in serve.targets(result)}
    assert checks["8 clients on 8 profiles: aggregate vs one client"]["met"] is True
    latency = checks["8 clients: each client's inter-token p95 vs alone"]
    assert latency["value"] == pytest.approx(8 ** 0.5) and latency["met"] is False
    text = serve.table(result)
    assert "| 1 |" in text and "| 8 |" in text and "**no**" in text and "6 LoRA, 2 BitDelta" in text
    assert serve.targets({**result, "rows": rows[:1]}) == []                           # not measured


def test_percentiles_take_the_nearest_rank():
    assert serve._percentile([5.0, 1.0, 3.0], 50) == 3.0
    assert serve._percentile([float(i) for i in range(101)], 95) == 95.0
