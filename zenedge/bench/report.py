"""Turn a benchmark result (the dict `run_bench` returns) into target checks and a Markdown table.
Pure functions: no torch, no timing; the unit tests feed them hand-made results."""

from __future__ import annotations

from typing import Any

from zenedge.bench import load

# DESIGN.md "Targets", the CPU rows this benchmark measures (bandwidth and llama.cpp: issue [N]).
SPEEDUP_VS_TRANSFORMERS = 3.0
BANDWIDTH_FRACTION = 0.60
VS_LLAMA_CPP = 1.0
SHIPPED_GGUF = "Q4_1"       # the embedded base's own file, the peer the target is against
VARIANT_VS_BASE = 0.90
SWITCH_MS = 50.0
# Issue [O]: aggregate decode of a batch vs one base row, one thread (rows, what the batch serves, wanted)
BATCH_TARGETS = ((4, "base", 3.0), (8, "mixed: 4 LoRA + 2 BitDelta + 2 base", 4.0),
                 (16, "mixed: 8 LoRA + 4 BitDelta + 4 base", 6.0))
PACKED_BITDELTA_VS_BASE = 0.85
# Issue [X]: constrained decoding's cost, a row under a JSON schema vs its unconstrained twin (rows, wanted)
CONSTRAINED_TARGETS = ((1, 0.90), (8, 0.85))


def find_row(rows: list[dict], engine: str, dtype: str, variant: str, batch: int = 1) -> dict | None:
    return next((r for r in rows if r["engine"] == engine and r["dtype"] == dtype and r["variant"] == variant
                 and r["rows"] == batch), None)


def _target(name: str, target: str, value: float | None, met: bool | None, detail: str) -> dict[str, Any]:
    return {"name": name, "target": target, "value": value, "met": met, "detail": detail}


def targets(result: dict) -> list[dict[str, Any]]:
    """Each CPU target with the measured value and whether it is met (None: not measured)."""
    rows, dtype = result["rows"], result["default_cpu_precision"]
    hf = find_row(rows, "transformers", "float32", "base")
    base = find_row(rows, "zenedge", dtype, "base")
    out = []
    if hf and base:
        speedup = base["decode_tokens_per_s"] / hf["decode_tokens_per_s"]
        out.append(_target("decode vs transformers' fp32 generate", f">= {SPEEDUP_VS_TRANSFORMERS:g}x", speedup,
                           speedup >= SPEEDUP_VS_TRANSFORMERS,
                           f"zenedge {dtype} {base['decode_tokens_per_s']:.1f} tok/s vs {hf['decode_tokens_per_s']:.1f}"))
    if base:
        fraction = base["bandwidth_fraction"]
        out.append(_target("decode bytes/s vs copy bandwidth", f">= {BANDWIDTH_FRACTION:.0%}", fraction,
                           fraction >= BANDWIDTH_FRACTION, f"zenedge {dtype} base, batch 1"))
    peer = next((p for p in result.get("peers") or [] if p["weights"] == SHIPPED_GGUF), None)
    if base and peer and peer.get("zenedge_vs_peer") is not None:
        rel = peer["zenedge_vs_peer"]
        out.append(_target(f"decode vs llama.cpp, same GGUF ({SHIPPED_GGUF})", f">= {VS_LLAMA_CPP:g}x", rel,
                           rel >= VS_LLAMA_CPP, f"zenedge {dtype} {base['decode_tokens_per_s']:.1f} tok/s vs "
                                                f"{peer['decode_tokens_per_s']:.1f}, median of per-round ratios"))
    for variant, label, wanted in (("LoRA r=8", "LoRA", VARIANT_VS_BASE),
                                   ("BitDelta (packed)", "BitDelta, packed", PACKED_BITDELTA_VS_BASE),
                                   ("BitDelta (dense copy)", "BitDelta, dense copy", VARIANT_VS_BASE)):
        row = find_row(rows, "zenedge", dtype, variant)
        if base and row:
            rel = _vs_base(row, base)
            out.append(_target(f"{label} decode vs base", f">= {wanted:g}x", rel, rel >= wanted,
                               f"{row['decode_tokens_per_s']:.1f} vs {base['decode_tokens_per_s']:.1f} tok/s"))
    for batch, variant, wanted in BATCH_TARGETS:
        row = find_row(rows, "zenedge", dtype, variant, batch)
        if base and row:
            rel = _vs_base(row, base)
            out.append(_target(f"{batch} rows, {variant}: aggregate vs one base row", f">= {wanted:g}x", rel,
                               rel >= wanted, f"{row['decode_tokens_per_s']:.1f} vs {base['decode_tokens_per_s']:.1f} "
                                              "tok/s"))
    for batch, wanted in CONSTRAINED_TARGETS:
        row = next((r for r in rows if r["rows"] == batch and "vs_unconstrained" in r), None)
        if row:
            rel = row["vs_unconstrained"]
            out.append(_target(f"{batch} row{'s' * (batch > 1)} under a JSON schema vs unconstrained",
                               f">= {wanted:g}x", rel, rel >= wanted,
                               f"{row['variant']}: {row['decode_tokens_per_s']:.1f} tok/s, median of per-round ratios"))
    if "switch_ms" in result:
        ms = result["switch_ms"]
        out.append(_target("cached variant switch", f"< {SWITCH_MS:g} ms", ms, ms < SWITCH_MS, "cache hit + grouping"))
    return out


def _vs_base(row: dict, base: dict) -> float:
    """The row's decode rate over one base row's: the median of per-round ratios where recorded."""
    return row.get("vs_one_base_row") or row["decode_tokens_per_s"] / base["decode_tokens_per_s"]


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "–"
    if kind == "x":
        return f"{value:.2f}×"
    if kind == "%":
        return f"{value:.0%}"
    if kind == "ms":
        return f"{value:.3g} ms"
    return f"{value:.3g}"


def _threads(report) -> str:
    if isinstance(report, int):     # results recorded before the thread policy
        return f"{report} thread(s)"
    return f"threads {report['setting']} (prefill {report['wide']}, decode {report.get('decode', report['wide'])})"


def _kernels(report: dict | None) -> str:
    """'C kernels: avx2 (ZENEDGE_CPU_ISA=avx2)', or why they are off."""
    if not report:
        return "C kernels not reported"
    return f"C kernels: {report['isa']} ({report['why']})" if report["isa"] else f"C kernels off ({report['why']})"


def markdown(result: dict) -> str:
    """The table BENCHMARKS.md records: rows, loads and switches, targets."""
    m = result["machine"]
    lines = [
        f"Run {result['date']} on {m['cpu']}, {m['cores']} cores, torch {m['torch']}, {_threads(m['threads'])}, "
        f"{_kernels(m.get('native_kernels'))}; "
        f"background load: {load.describe(result.get('background_load', 0))}; "
        f"load average at start {m['load_average_at_start']}. Base: {result['base_dir']} ({result['base_source']}). "
        f"{result['tokens']} new tokens, greedy, batch rows as listed; medians of {result['repeats']} interleaved rounds. "
        f"Copy bandwidth (read+write) {result['copy_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s.",
        "",
        "| engine | weights | rows | variant | prefill tok/s | decode tok/s | ÷ one base row | decode tok/s per CPU-s "
        "| ms/step | MB read/step | of copy bandwidth |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {r['dtype']} | {r['rows']} | {r['variant']} | {r['prefill_tokens_per_s']:.0f} | "
                     f"{r['decode_tokens_per_s']:.1f} | {_fmt(r.get('vs_one_base_row'), 'x')} | "
                     f"{r['decode_tokens_per_cpu_s']:.1f} | {r['ms_per_step']:.1f} | "
                     f"{r['bytes_per_step'] / 1e6:.0f} | {r['bandwidth_fraction']:.0%} |")
    twins = [r for r in result["rows"] if "vs_unconstrained" in r]
    if twins:
        lines += ["", "Under a JSON schema (every step masked by llguidance, rows of an array of free strings), "
                      "each row against its unconstrained twin, median of per-round ratios: "
                  + "; ".join(f"{r['rows']} × {r['variant']} {r['vs_unconstrained']:.2f}x" for r in twins) + "."]
    if result.get("peers"):
        p0 = result["peers"][0]
        lines += ["", f"llama.cpp `llama-bench -t {p0.get('n_threads')} -p 0 -n {result['tokens']} -r 1`, build "
                      f"{p0.get('build')}, one process per round right after zenedge's {result['default_cpu_precision']} "
                      f"base row (its decode starts from an empty context):", "",
                  "| peer | GGUF weights | decode tok/s | ms/step | MB read/step | of copy bandwidth | "
                  f"zenedge {result['default_cpu_precision']} ÷ peer |", "|---|---|---|---|---|---|---|"]
        for p in result["peers"]:
            lines.append(f"| llama.cpp | {p['weights']} | {p['decode_tokens_per_s']:.1f} | "
                         f"{1e3 / p['decode_tokens_per_s']:.1f} | {p['bytes_per_step'] / 1e6:.0f} | "
                         f"{p['bandwidth_fraction']:.0%} | {_fmt(p['zenedge_vs_peer'], 'x')} |")
    elif result.get("peers_skipped"):
        lines += ["", result["peers_skipped"] + "."]
    if result.get("gemv"):
        parts = [f"{name} {g['ms']:.1f} ms ({g['gb_per_s']:.1f} GB/s, CPU {g['cpu_ms']:.1f} ms)"
                 for name, g in result["gemv"].items()]
        lines += ["", "Matrix-vector products alone, one decode step's weights: " + "; ".join(parts) + "."]
    loads = result.get("cold_load_seconds", {})
    if loads:
        densify = loads.get("bitdelta_densify")
        dense = f", + {1e3 * densify:.0f} ms to build its dense weights" if densify is not None else \
            " (no dense copy built: a real-size base)"
        lines += ["", f"Cold load (file → servable variant): LoRA {1e3 * loads['lora']:.0f} ms, BitDelta "
                      f"{1e3 * loads['bitdelta']:.0f} ms{dense}. Cached switch: {result['switch_ms']:.3f} ms."]
    lines += ["", "| target | wanted | measured | met |", "|---|---|---|---|"]
    for t in targets(result):
        kind = "x" if t["target"].endswith("x") else "%" if t["target"].endswith("%") else "ms"
        met = "–" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['name']} ({t['detail']}) | {t['target'].replace('x', '×')} | {_fmt(t['value'], kind)} | {met} |")
    return "\n".join(lines)
