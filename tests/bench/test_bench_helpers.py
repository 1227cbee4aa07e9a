"""The benchmark's pure parts: byte accounting, agreement, target checks, the table. No timing."""

import subprocess
import sys

import pytest
import torch

from zenedge.bench import bandwidth, report
from zenedge.bench.agreement import PROMPTS, prefix_agreement


def test_kv_bytes_count_keys_and_values_of_every_layer():
    # SmolLM2-135M: 30 layers, 3 kv heads of 64, fp32
    assert bandwidth.kv_bytes_per_position(30, 3, 64, 4) == 2 * 30 * 3 * 64 * 4


def test_step_bytes_read_weights_once_per_batch_and_kv_per_row():
    step = bandwidth.step_bytes(weight_bytes=1000, variant_bytes=[10, 20], kv_per_position=3, context=[5, 7])
    assert (step.weights, step.variants, step.kv_cache, step.total) == (1000, 30, 36, 1066)


def test_mean_context_averages_the_decode_steps():
    # prompt 10, 4 new tokens: decode steps attend to 11, 12, 13 positions
    assert bandwidth.mean_context(10, 4) == 12
    assert bandwidth.mean_context(10, 1) == 11


def test_ratio_of_nothing_is_not_a_number():
    assert bandwidth.ratio(5.0, 10.0) == 0.5
    assert bandwidth.ratio(5.0, 0.0) != bandwidth.ratio(5.0, 0.0)


def test_prefix_agreement_stops_counting_at_the_first_divergence():
    a = [[1, 2, 3, 4], [5, 6], [7]]
    b = [[1, 2, 9, 4], [5, 6], [8, 8]]
    got = prefix_agreement(a, b)
    assert got["token_agreement"] == pytest.approx((2 + 2 + 0) / (4 + 2 + 2))
    assert got["identical_prompts"] == pytest.approx(1 / 3)
    assert prefix_agreement(a, a) == {"token_agreement": 1.0, "identical_prompts": 1.0}
    with pytest.raises(ValueError):
        prefix_agreement(a, b[:2])


def test_there_are_fifty_distinct_prompts():
    assert len(PROMPTS) == len(set(PROMPTS)) == 50


def row(engine, dtype, variant, tok_s, fraction=0.5, rows=1, name=None):
    return {"name": name or engine, "engine": engine, "dtype": dtype, "rows": rows, "variant": variant,
            "prefill_tokens_per_s": 100.0, "decode_tokens_per_s": tok_s, "decode_tokens_per_cpu_s": tok_s * 1.5,
            "ms_per_step": 1e3 / tok_s, "bytes_per_step": 270_000_000, "bandwidth_fraction": fraction, "samples": 3}


def result(**overrides):
    out = {
        "date": "2026-11-30", "tokens": 64, "repeats": 3, "base_dir": "/x", "base_source": "test",
        "default_cpu_precision": "bfloat16", "copy_bandwidth_bytes_per_s": 10e9, "switch_ms": 0.02,
        "cold_load_seconds": {"lora": 0.01, "bitdelta": 0.03, "bitdelta_densify": 0.9},
        "gemv": {"float32 F.linear": {"ms": 40.0, "cpu_ms": 39.0, "bytes": 540_000_000, "gb_per_s": 13.5}},
        "machine": {"cpu": "test cpu", "cores": 2, "torch": "2.x", "threads": 1, "load_average_at_start": [1, 1, 1]},
        "rows": [row("transformers", "float32", "base", 10.0), row("zenedge", "bfloat16", "base", 20.0, 0.65),
                 row("zenedge", "bfloat16", "LoRA r=8", 19.0), row("zenedge", "bfloat16", "BitDelta (packed)", 17.0),
                 row("zenedge", "float32", "base", 12.0), row("zenedge", "bfloat16", "base", 70.0, rows=4),
                 dict(row("zenedge", "bfloat16", "mixed: 4 LoRA + 2 BitDelta + 2 base", 50.0, rows=8),
                      vs_one_base_row=2.6)],
    }
    out.update(overrides)
    return out


def test_targets_compare_the_default_dtype_rows():
    checks = {t["name"]: t for t in report.targets(result())}
    speedup = checks["decode vs transformers' fp32 generate"]
    assert speedup["value"] == pytest.approx(2.0) and speedup["met"] is False
    assert checks["decode bytes/s vs copy bandwidth"]["met"] is True
    assert checks["LoRA decode vs base"]["value"] == pytest.approx(0.95) and checks["LoRA decode vs base"]["met"]
    assert checks["BitDelta, packed decode vs base"]["met"] is True   # 0.85: its own target
    assert "BitDelta, dense copy decode vs base" not in checks           # not measured
    four = checks["4 rows, base: aggregate vs one base row"]
    assert four["value"] == pytest.approx(3.5) and four["met"] is True  # a batch row is not taken for one row
    eight = checks["8 rows, mixed: 4 LoRA + 2 BitDelta + 2 base: aggregate vs one base row"]
    assert eight["value"] == pytest.approx(2.6) and eight["met"] is False   # the per-round ratio, where recorded
    assert checks["cached variant switch"]["met"] is True


def test_constrained_rows_are_held_to_their_unconstrained_twins():
    constrained = [dict(row("zenedge", "bfloat16", "base, JSON schema", 18.0), vs_unconstrained=0.93),
                   dict(row("zenedge", "bfloat16", "mixed, JSON schema", 40.0, rows=8), vs_unconstrained=0.80)]
    checks = {t["name"]: t for t in report.targets(result(rows=result()["rows"] + constrained))}
    one, eight = checks["1 row under a JSON schema vs unconstrained"], checks["8 rows under a JSON schema vs unconstrained"]
    assert one["value"] == pytest.approx(0.93) and one["met"] is True
    assert eight["value"] == pytest.approx(0.80) and eight["met"] is False
    assert "1 row under a JSON schema vs unconstrained" not in {t["name"] for t in report.targets(result())}


def test_a_constrained_bench_row_decodes_every_token_masked(engine):
    """The bench's schema cannot end within the run, so the row's rate is of `tokens` masked steps."""
    from zenedge.bench.throughput import CONSTRAINED_SCHEMA, zenedge_case
    from zenedge.runtime.generate import GenerationRequest, SamplingParams
    from zenedge.runtime.grammar import Grammar
    from zenedge.runtime.prompts import encode_chat

    resident = engine.resident("tiny")
    prompt = encode_chat(resident.tokenizer, [{"role": "user", "content": "a list"}])
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=3, grammar=Grammar.json_schema(CONSTRAINED_SCHEMA, "x"))
    timing = zenedge_case(resident, [GenerationRequest(prompt, None, params)] * 2)()
    assert timing.decode_tokens == 2 * 23   # the first token of each row comes from the prefill


def test_targets_skip_what_was_not_measured():
    partial = result(rows=[row("zenedge", "bfloat16", "base", 20.0)])
    del partial["switch_ms"]
    names = [t["name"] for t in report.targets(partial)]
    assert names == ["decode bytes/s vs copy bandwidth"]


def test_markdown_has_every_row_and_every_target():
    text = report.markdown(result())
    table_rows = [line for line in text.splitlines() if line.startswith("| ") and "tok/s" not in line]
    assert sum("| base |" in line or "LoRA r=8 |" in line or "BitDelta" in line for line in table_rows) >= 5
    assert "2026-11-30" in text and "test cpu" in text and "**no**" in text
    assert "float32 F.linear 40.0 ms (13.5 GB/s" in text
    assert text.count("| yes |") == 5      # bandwidth, LoRA, packed BitDelta, 4 base rows, switch


def test_importing_the_cli_and_the_bench_stays_free_of_torch():
    code = ("import sys, zenedge.cli, zenedge.bench, zenedge.bench.report, zenedge.bench.bandwidth, "
            "zenedge.bench.agreement, zenedge.bench.throughput, zenedge.cli.bench_cmds;"
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_bench_command_is_registered():
    from click.testing import CliRunner

    from zenedge.cli import app

    got = CliRunner().invoke(app, ["bench", "--help"])
    assert got.exit_code == 0 and "run" in got.output and "dtypes" in got.output


def test_mixed_batches_take_their_rows_as_the_targets_name_them():
    from zenedge.bench.throughput import describe_mix, mixed_rows
    from zenedge.merge.factors import LoraFactors
    from zenedge.runtime.variants import BitDeltaModule, Variant

    one = torch.zeros(1, 1)
    loras = [Variant(f"l{i}", "lora", {"m": LoraFactors(one, one, 1.0)}) for i in range(4)]
    deltas = [Variant(f"d{i}", "bitdelta", {"m": BitDeltaModule(one, one, 8)}) for i in range(2)]
    eight = mixed_rows(8, loras, deltas)
    assert describe_mix(eight) == report.BATCH_TARGETS[1][1]
    assert len({id(v) for v in eight if v is not None}) == 6               # every LoRA and BitDelta once
    assert describe_mix(mixed_rows(16, loras, deltas)) == report.BATCH_TARGETS[2][1]
    assert describe_mix(mixed_rows(2, loras, deltas)) == "mixed: 1 LoRA + 1 BitDelta"
    assert describe_mix([None] * 4) == report.BATCH_TARGETS[0][1]
