"""The fault script's small version (the full run's figures are in benchmarks/*-faults.json and
the README's Reliability section): every category of fault is exercised and nothing is lost."""

from tests.faults import QUICK, run, table
from tests.server.harness import one_torch_thread


def test_quick_fault_run_loses_nothing(tmp_path):
    with one_torch_thread():
        report = run(tmp_path, writer_kills_n=QUICK["writer_kills"], daemon_kills_n=QUICK["daemon_kills"],
                     streams=QUICK["streams"], cli=QUICK["cli"], throttle=QUICK["throttle"], heavy=False,
                     log=lambda line: None)
    assert report["ok"], table(report)
    results = report["results"]
    assert all(results[k]["tried"] > 0 for k in ("writer_kills", "daemon_kills", "bad_cli", "bad_http", "streams"))
    assert report["lost"] == 0 and report["final_check"]["ok"]
