"""The CPU kernels' benchmark (tools/cpu_kernels.py) runs and reports ratios. No timing is asserted."""

import pytest

from tools import cpu_kernels
from zenedge.kernels import native


def test_the_cpu_kernel_bench_measures_every_contender():
    if native.library() is None:
        pytest.skip("no native CPU kernels on this machine")
    results = cpu_kernels.run(rounds=1)
    ratios = [results["int4_streamed"]["ratio"], results["rms_norm_576"]["ratio"],
              *(r["ratio"] for r in results["int4_rows"].values()),
              *(r["ratio"] for r in results["decode_attention"].values())]
    assert len(ratios) == 9 and all(r > 0 for r in ratios)     # measured, not asserted: timings vary
    assert "30 layers streamed" in cpu_kernels.report(results)


def test_the_cpu_kernel_bench_times_each_instruction_set_this_cpu_runs():
    contenders = [name for name in native.runnable_isas() if name != "scalar"]
    if not contenders:
        pytest.skip("this CPU runs no vector build of the kernels")
    results = cpu_kernels.instruction_sets(rounds=1, layers=1)
    assert len(results) == 7
    for case, builds in results.items():
        assert list(builds) == contenders, case
        assert builds[contenders[0]]["÷ best"] == 1.0 and all(r["ms"] > 0 for r in builds.values())
    assert f"Q8_0 head, 1 row: {contenders[0]} " in cpu_kernels.report({"instruction_sets": results})
