import time

import pytest

from zenedge.pool.phases import Phases


def test_phase_seconds_add_up_to_no_more_than_the_total():
    events = []
    phases = Phases(events.append)
    for name in ("rank", "fold", "gate", "gate", "commit"):
        with phases.phase(name, f"doing {name}") as record:
            time.sleep(0.002)
            record["rows"] = 1
    profile = phases.profile()
    assert [e["phase"] for e in events] == ["rank", "fold", "gate", "gate", "commit"]
    assert sum(profile["by_phase"].values()) <= profile["total_seconds"] + 0.0005 * len(phases.records)
    assert profile["by_phase"]["gate"] >= 0.004 and profile["phases"][2]["rows"] == 1


def test_a_phase_inside_another_is_refused_so_no_time_counts_twice():
    phases = Phases()
    with pytest.raises(RuntimeError, match="inside 'gate'"):
        with phases.phase("gate", "weighing"):
            with phases.phase("gate", "checking"):
                pass
    with phases.phase("commit", "after a refused nesting, phases work again"):
        pass
    assert [r["phase"] for r in phases.records] == ["gate", "commit"]
