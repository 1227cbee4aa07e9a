"""`zenedge bench pool`'s report: what a pull's --json result says becomes one row (where the pool's
time went, per phase), and the scenario's figures (median of merging pulls, end to end)."""

from zenedge.bench.pool import _row, table


def pull_result(action, phases, merged_with=(), examples=()):
    by_phase = {name: 0.0 for name in ("load", "rank", "fold", "anchors", "gate", "commit", "evict")}
    for phase, seconds in phases:
        by_phase[phase] += seconds
    attempts = [{"candidate": "c" * 12, "members": list(merged_with), "examples": {"x": n}, "accepted": True}
                for n in examples]
    return {"policy": action, "merged_with": list(merged_with), "attempts": attempts,
            "profile": {"total_seconds": round(sum(s for _, s in phases) + 0.1, 3), "by_phase": by_phase,
                        "phases": [{"phase": p, "seconds": s} for p, s in phases]}}


def test_rows_carry_the_pool_phases_and_the_table_reports_the_scenario():
    rows = [_row("arith", 20.0, pull_result("stored", [("commit", 0.01)]), first_use=True),
            _row("jsonx", 12.0, pull_result("merged", [("load", 2.5), ("rank", 0.1), ("fold", 0.2), ("anchors", 1.4),
                                                       ("gate", 5.0), ("commit", 0.1)], ["csvx"], [16])),
            _row("writer", 30.0, pull_result("merged", [("load", 2.5), ("gate", 20.0), ("gate", 4.0)],
                                             ["coder"], [32, 48]))]
    assert rows[1]["by_phase"]["load"] == 2.5 and rows[1]["candidates_gated"] == 1
    assert rows[2]["by_phase"]["gate"] == 24.0 and rows[2]["candidates_gated"] == 2
    result = {"pulls": rows, "total_seconds": 62.0, "pulls_after_setup_seconds": 42.0, "process_seconds": 0.3,
              "merged_median_seconds": 21.0, "budget_bytes": 1000, "threads": 1}
    text = table(result)
    assert "| jsonx | 12.0 | 9.4 | merged with csvx | 2.5 | 1.4 | 5.0 | 1 | 16 |" in text
    assert "| writer | 30.0 |" in text and "32, 48" in text
    assert "median wall time of a pull that merged: 21.0 s" in text and "62 s" in text


def test_the_table_says_who_did_the_pools_work():
    rows = [_row("arith", 20.0, pull_result("stored", [("commit", 0.01)]), first_use=True)]
    base = {"pulls": rows, "total_seconds": 20.0, "pulls_after_setup_seconds": 0.0, "process_seconds": 0.3,
            "merged_median_seconds": None, "budget_bytes": 1000, "threads": 1}
    assert "started a background daemon" in table({**base, "mode": "cli", "daemon": False})
    assert "in its own process" in table({**base, "mode": "local", "daemon": False})
    assert "in its own process" in table(base)  # JSONs from before the modes: every pull was local
    served = table({**base, "mode": "daemon", "daemon": True, "daemon_start_seconds": 2.5})
    assert "through a running `zenedge serve` (ready 2.5 s" in served and "own process" not in served
