"""`zenedge bench run`: decode throughput on the real default base, in one process and one run.

Rows: transformers' own `generate` (fp32, bf16) beside zenedge's loop for the plain base, a LoRA
variant, a BitDelta variant (packed, as served by default; and with a dense copy,
`runtime.bitdelta_dense = "always"`), batches of 1, 2, 4, 8 and 16 rows of the base alone and of
mixed variants (LoRA, packed BitDelta and base rows: `mixed_rows`), the reference loop
(transformers' DynamicCache), and one base row and the mixed 8-row batch decoding under a JSON
schema, each against its unconstrained twin (`constrained_cases`). Each zenedge row of the default precision also gets its ratio to one
base row, the median of the per-round ratios. Every row is timed once per round
and the rounds interleave the rows, so a neighbour's load spike hits all rows alike; medians are
reported. Besides tokens/s: cached variant switch and cold load times, bytes read per step, and
the copy bandwidth measured in the same run (the bound decode tokens/s are compared with). Given a
built llama.cpp `llama-bench` (zenedge/bench/peers.py), its decode of the same GGUF runs in every
round right after zenedge's default-precision base row, at the same thread count.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Callable

from zenedge.bench import bandwidth
from zenedge.runtime import threads

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle."}]


@dataclass
class Options:
    tokens: int = 64
    repeats: int = 3
    threads: int | None = None
    base_dir: Path | None = None
    switches: int = 200
    llama_bench: Path | None = None     # else ZENEDGE_LLAMA_BENCH, else no llama.cpp rows


@dataclass
class Timing:
    """One generation: seconds until every row has its first token (the prompts prefilled) and for
    the rest; `decode_tokens`: the tokens of the rest, where counted (else rows × (tokens - 1))."""

    prefill_wall: float
    decode_wall: float
    decode_cpu: float
    decode_tokens: int | None = None


@dataclass(eq=False)   # a case is itself (a key of constrained_cases' twins), not its fields
class Case:
    name: str
    engine: str                   # "transformers" | "zenedge" | "zenedge-reference"
    dtype: str
    rows: int
    variant: str                  # what the rows serve
    run: Callable[[], Timing] = field(repr=False)
    bytes_per_step: int = 0
    timings: list[Timing] = field(default_factory=list, repr=False)

    def warm_up(self) -> None:
        self.run()

    def measure(self) -> None:
        self.timings.append(self.run())

    def decode_rates(self, tokens: int) -> list[float]:
        """tokens/s of each round's decode steps (the first token comes from the prefill)."""
        return [(t.decode_tokens or self.rows * max(tokens - 1, 1)) / t.decode_wall for t in self.timings]


def _progress(message: str) -> None:
    import sys

    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- the base -----------------------------------------------------------------------------------

def resolve_base(explicit: Path | None, progress=_progress) -> tuple[Path, str, tempfile.TemporaryDirectory | None]:
    """The default base's HF directory: given, or the user's store, or converted into a temp home."""
    from zenedge import bases, paths
    from zenedge.store import Store

    if explicit is not None:
        return Path(explicit), f"directory {explicit}", None
    home = paths.home()
    if home.exists():
        store = Store(home)
        row = store.base(bases.DEFAULT_BASE)
        if row is not None:
            return store.home / row["dir"], f"store {home}", None
    scratch = tempfile.TemporaryDirectory(prefix="zenedge-bench-")
    progress(f"converting {bases.DEFAULT_BASE} into a temporary store (first use, ~40 s)")
    store = Store(Path(scratch.name) / "home")
    row = bases.ensure_base(store, bases.DEFAULT_BASE, progress=progress)
    return store.home / row["dir"], "converted into a temporary store", scratch


# -- timing one generation --------------------------------------------------------------------------

class _Clock:
    """Wall and CPU clocks at the start, at the first token and at the end."""

    def __init__(self):
        self.start = time.perf_counter()
        self.first = self.first_cpu = None

    def token(self) -> None:
        if self.first is None:
            self.first, self.first_cpu = time.perf_counter(), time.process_time()

    def done(self, decode_tokens: int | None = None) -> Timing:
        end, end_cpu = time.perf_counter(), time.process_time()
        return Timing(self.first - self.start, end - self.first, end_cpu - self.first_cpu, decode_tokens)


class _Streamer:
    """transformers' streamer protocol: put(prompt ids) once, then put(new token) per step."""

    def __init__(self, clock: _Clock):
        self.clock, self.calls = clock, 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.clock.token()

    def end(self) -> None:
        pass


def transformers_case(model, input_ids, tokens: int) -> Callable[[], Timing]:
    import torch

    mask = torch.ones_like(input_ids)
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else model.generation_config.eos_token_id

    def run() -> Timing:
        clock = _Clock()
        with torch.inference_mode():
            model.generate(input_ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                           do_sample=False, streamer=_Streamer(clock), pad_token_id=pad)
        return clock.done()

    return run


def zenedge_case(resident, requests, stepper: str = "auto") -> Callable[[], Timing]:
    from zenedge.runtime.generate import generate

    def run() -> Timing:
        # Decode is timed from the tick in which the last row got its first token: before it, the
        # batch still prefills prompts (in chunks between steps), which is not what a step costs.
        clock, started, decoded = _Clock(), set(), 0
        for deltas in generate(resident, requests, stepper=stepper):
            tokens = [d.index for d in deltas if d.token_id is not None]
            if clock.first is not None:
                decoded += len(tokens)
                continue
            started.update(tokens)
            if len(started) == len(requests):
                clock.token()
        return clock.done(decoded)

    return run


# -- the run ------------------------------------------------------------------------------------------

def machine() -> dict:
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from zenedge.kernels import native

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    isa, why = native.in_use()
    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__,
            "native_kernels": {"isa": isa, "why": why},
            "threads": threads.policy().report(single_step=True), "load_average_at_start": [round(x, 2) for x in load], "python": platform.python_version()}


def _weight_bytes(model) -> int:
    """Bytes of every weight a decode step streams: decoder linears and the output head, each in
    the form its matmul reads (plain, packed, int8 or int4 copy; a tied embedding is read once, as
    the head; the embedding lookup reads one row)."""
    import torch

    from zenedge.runtime.layers import FastLinear, VariantLinear

    wrappers = [m for m in model.modules() if isinstance(m, (VariantLinear, FastLinear))]
    inside = {id(m.base) for m in wrappers}          # counted through their wrapper
    plain = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and id(m) not in inside]
    return (sum(m.fast.nbytes if m.fast is not None else m.weight.numel() * m.weight.element_size() for m in wrappers)
            + sum(m.weight.numel() * m.weight.element_size() for m in plain))


def _kv_bytes(config, element_size: int) -> int:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return bandwidth.kv_bytes_per_position(config.num_hidden_layers, kv_heads, head_dim, element_size)


def _variant_extra(variant) -> int:
    """What a variant adds to a step's reads. LoRA: its factors. Dense BitDelta: nothing beyond
    the base's bytes when alone (it replaces W), one more weight set in a mixed batch (counted by
    the caller). Packed BitDelta: its bits and scales, read beside W."""
    from zenedge.runtime.variants import BitDeltaModule

    if variant is None:
        return 0
    extra = 0
    for module in variant.modules.values():
        if isinstance(module, BitDeltaModule):
            if module.dense is None:
                extra += module.packed.numel() + module.alpha.numel() * 4
        else:
            extra += module.A.numel() * module.A.element_size() + module.B.numel() * module.B.element_size()
    return extra


def _dense_bytes(variant) -> int:
    from zenedge.runtime.variants import BitDeltaModule

    total = 0
    for m in variant.modules.values():
        if isinstance(m, BitDeltaModule) and m.dense is not None:
            total += getattr(m.dense, "nbytes", None) or m.dense.numel() * m.dense.element_size()
    return total


PRECISIONS = ("float32", "bfloat16", "int8", "int4")


def precisions():
    """What the rows compare: label (PRECISIONS) → (model dtype, `runtime.weights`). int8/int4
    keep fp32 activations (their kernels run on bf16 copies of them)."""
    import torch

    return {"float32": (torch.float32, "full"), "bfloat16": (torch.bfloat16, "full"),
            "int8": (torch.float32, "int8"), "int4": (torch.float32, "int4")}


def default_precision() -> str:
    """The label of what `runtime.dtype = "auto"` and `runtime.weights = "auto"` give on CPU."""
    import torch

    from zenedge.runtime.device import pick_dtype, pick_weights

    cpu = torch.device("cpu")
    chosen = (pick_dtype("auto", cpu), pick_weights("auto", cpu))
    return next(label for label, setup in precisions().items() if setup == chosen)


def _memory_needed(base_dir: Path, setups: dict, transformers_models: bool) -> int:
    """Bytes the rows hold at once: one resident per precision, and transformers' fp32 and bf16
    models when asked (at 1.7B, everything is about 31 GiB)."""
    import torch

    from zenedge.runtime.model import LOAD_HEADROOM, resident_bytes

    needed = sum(resident_bytes(base_dir, dtype, weights)[1] for dtype, weights in setups.values())
    if transformers_models:
        needed += int(resident_bytes(base_dir, torch.float32, "int4")[0] * (4 + 2) * LOAD_HEADROOM)
    return needed


def _fitting_setups(base_dir: Path, setups: dict, default: str, progress) -> tuple[dict, bool]:
    """(the precisions to load, whether transformers' models are loaded too): all of them where
    they fit the free memory; else the default precision's resident alone (a real-size base),
    said once; else a one-line refusal before anything is loaded (the kernel's OOM killer ended
    a 1.7B run on a 24 GiB machine that loaded everything)."""
    import psutil

    from zenedge.errors import Unavailable
    from zenedge.sizes import format_size

    free = psutil.virtual_memory().available
    if _memory_needed(base_dir, setups, True) <= free:
        return setups, True
    alone = {default: setups[default]}
    needed = _memory_needed(base_dir, alone, False)
    if needed > free:
        raise Unavailable(f"bench run needs about {format_size(needed)} for {base_dir.name}'s resident; "
                          f"{format_size(free)} is free", hint="close other programs, or measure a smaller base")
    progress(f"{base_dir.name}: only the {default} resident fits beside the others' "
             f"{format_size(_memory_needed(base_dir, setups, True))}: no transformers, other-precision or "
             f"dense-BitDelta rows")
    return alone, False


def run_bench(options: Options, progress=_progress) -> dict:
    from zenedge.bench import peers

    llama_bench = peers.locate(options.llama_bench)      # a broken one fails now, not after the loads

    import torch

    from zenedge.bench.variants import load_lora_variant, make_bitdelta, make_lora
    from zenedge.runtime.cache import DeltaCache
    from zenedge.runtime.dense_bitdelta import DenseBitDeltas
    from zenedge.runtime.generate import GenerationRequest, SamplingParams
    from zenedge.runtime.prompts import encode_chat
    from zenedge.runtime.model import load_causal_lm, load_resident
    from zenedge.runtime.variants import load_bitdelta

    threads.configure(options.threads or "auto")
    cpu = torch.device("cpu")
    dd = default_precision()
    setups = precisions()
    base_dir, base_source, scratch = resolve_base(options.base_dir, progress)
    result: dict = {"date": date.today().isoformat(), "machine": machine(), "base_dir": str(base_dir),
                    "base_source": base_source, "tokens": options.tokens, "repeats": options.repeats,
                    "default_cpu_precision": dd}
    setups, with_transformers = _fitting_setups(base_dir, setups, dd, progress)
    work = tempfile.TemporaryDirectory(prefix="zenedge-bench-variants-")
    try:
        progress("making variants: 4 PEFT LoRAs (r=8, q/k/v/o), 2 BitDeltas")
        w = Path(work.name)
        lora_dirs = [make_lora(base_dir, w / f"lora-{i}", seed=i) for i in range(4)]
        delta_files = [make_bitdelta(base_dir, w / f"delta-{i}.bitdelta", seed=10 + i) for i in range(2)]

        progress("loading residents and transformers' models")
        residents = {label: load_resident("bench", base_dir, cpu, dtype, weights)
                     for label, (dtype, weights) in setups.items()}
        hf = {dt: load_causal_lm(base_dir, dtype=dt).eval()
              for dt in ((torch.float32, torch.bfloat16) if with_transformers else ())}
        tokenizer = residents[dd].tokenizer
        prompt = encode_chat(tokenizer, PROMPT)
        input_ids = torch.tensor([prompt])
        # No early stop: every row decodes exactly `tokens` (eos -1 never matches).
        endless = {label: dataclasses.replace(r, eos_ids=(-1,)) for label, r in residents.items()}

        # Variants on the default precision, through the runtime's own cache and dense-copy
        # manager (budget: room for all; the dense rows ask for copies, the others are served as
        # the default serves them: packed).
        resident = residents[dd]
        cache = DeltaCache(64 << 30)
        dense = DenseBitDeltas(cache)
        loras = [cache.get(f"lora-{i}", lambda d=d, i=i: load_lora_variant(f"lora-{i}", d, cpu, resident.dtype))
                 for i, d in enumerate(lora_dirs)]
        # Dense copies (a whole base's linears each) only where everything fit: an 8B run that made
        # them was OOM-killed on a 24 GiB machine; a real-size base serves BitDeltas packed.
        cached = [cache.get(f"delta-{i}", lambda p=p, i=i: load_bitdelta(f"delta-{i}", p, cpu))
                  for i, p in enumerate(delta_files)]
        deltas = [dense.prepare(v, resident.model, "always") for v in cached] if with_transformers else []
        packed = [load_bitdelta(f"packed-{i}", p, cpu) for i, p in enumerate(delta_files)]   # never densified

        result["cold_load_seconds"] = _cold_loads(lora_dirs[0], delta_files[0], resident, cpu, options.repeats,
                                                  with_dense=bool(deltas))
        result["switch_ms"] = _switch_ms(cache, dense, resident, ["lora-0", "delta-0"], options.switches, cpu,
                                         "always" if deltas else "never")

        n = options.tokens
        ctx = bandwidth.mean_context(len(prompt), n)
        kv = {label: _kv_bytes(r.model.config, r.dtype.itemsize) for label, r in residents.items()}
        weights = {label: _weight_bytes(r.model) for label, r in residents.items()}

        def one(variant):
            return [GenerationRequest(prompt, variant, SamplingParams(max_tokens=n))]

        def bytes_for(label, variants, rows=1, mixed=False):
            extras = [_variant_extra(v) for v in variants]
            if mixed:   # dense BitDelta rows read their own full weights beside the base's
                extras += [_dense_bytes(v) for v in variants if v is not None]
            return bandwidth.step_bytes(weights[label], extras, kv[label], [round(ctx)] * rows).total

        def batch(variants):
            return [GenerationRequest(prompt, v, SamplingParams(max_tokens=n)) for v in variants]

        def batch_case(variants, label):
            distinct = list({id(v): v for v in variants}.values())
            return Case("zenedge", "zenedge", dd, len(variants), label, zenedge_case(endless[dd], batch(variants)),
                        bytes_for(dd, distinct, rows=len(variants)))
        cases = [Case("transformers generate", "transformers", label, 1, "base",
                      transformers_case(hf[dt], input_ids, n), bytes_for(label, [None]))
                 for label, (dt, _) in list(setups.items())[:2] if dt in hf]
        if "float32" in endless:
            cases.append(Case("zenedge reference loop (DynamicCache)", "zenedge-reference", "float32", 1, "base",
                              zenedge_case(endless["float32"], one(None), "dynamic"), bytes_for("float32", [None])))
        cases += [
            Case("zenedge", "zenedge", dd, 1, "base", zenedge_case(endless[dd], one(None)), bytes_for(dd, [None])),
            Case("zenedge", "zenedge", dd, 1, "LoRA r=8", zenedge_case(endless[dd], one(loras[0])),
                 bytes_for(dd, [loras[0]])),
            Case("zenedge", "zenedge", dd, 1, "BitDelta (packed)", zenedge_case(endless[dd], one(packed[0])),
                 bytes_for(dd, [packed[0]])),
        ]
        if deltas:
            cases += [
                Case("zenedge", "zenedge", dd, 1, "BitDelta (dense copy)", zenedge_case(endless[dd], one(deltas[0])),
                     bytes_for(dd, [deltas[0]])),
                Case("zenedge", "zenedge", dd, 4, "mixed, dense BitDelta copies: 2 LoRA + 2 BitDelta",
                     zenedge_case(endless[dd], batch([loras[0], loras[1], deltas[0], deltas[1]])),
                     bytes_for(dd, [loras[0], loras[1], deltas[0], deltas[1]], rows=4, mixed=True)),
            ]
        for rows in BATCH_ROWS[1:]:
            cases.append(batch_case([None] * rows, "base"))
        for rows in BATCH_ROWS[1:]:
            variants = mixed_rows(rows, loras, packed)
            cases.append(batch_case(variants, describe_mix(variants)))
        cases += [Case("zenedge", "zenedge", label, 1, "base", zenedge_case(endless[label], one(None)),
                       bytes_for(label, [None])) for label in setups if label != dd]
        base_case = next(c for c in cases if c.engine == "zenedge" and c.dtype == dd and c.variant == "base")
        twins = constrained_cases(cases, resident, prompt, n, loras, packed, bytes_for)
        cases += list(twins)
        kv_fp16 = _kv_bytes(resident.model.config, 2)         # llama.cpp's KV cache is fp16
        peer_rows, result["peers_skipped"] = _peers(llama_bench, options, n, kv_fp16, w, progress)
        at = cases.index(base_case) + 1
        schedule = cases[:at] + peer_rows + cases[at:]        # llama.cpp right beside zenedge's base
        progress("matrix-vector products over a whole model's weights, per precision")
        result["gemv"] = gemv_speeds(residents, options.repeats)
        progress("copy bandwidth")
        result["copy_bandwidth_bytes_per_s"] = bandwidth.copy_bandwidth()
        for item in schedule:                                # warm-up: allocators, caches, first-call costs
            item.warm_up()
        for round_ in range(options.repeats):
            progress(f"round {round_ + 1}/{options.repeats}")
            for item in schedule:
                item.measure()
        copy_after = bandwidth.copy_bandwidth()
        copy_bw = result["copy_bandwidth_bytes_per_s"] = statistics.median([result["copy_bandwidth_bytes_per_s"], copy_after])
        result["rows"] = [_summarise(c, len(prompt), n, copy_bw) for c in cases]
        for row, case in zip(result["rows"], cases):
            if case.engine == "zenedge" and case.dtype == dd:
                row["vs_one_base_row"] = statistics.median(
                    r / b for r, b in zip(case.decode_rates(n), base_case.decode_rates(n)))
        for row, case in zip(result["rows"], cases):
            if case in twins:
                row["vs_unconstrained"] = statistics.median(
                    r / b for r, b in zip(case.decode_rates(n), twins[case].decode_rates(n)))
        result["peers"] = [peers.summarise(p, base_case.decode_rates(n), copy_bw) for p in peer_rows]
        return result
    finally:
        work.cleanup()
        if scratch is not None:
            scratch.cleanup()


def _peers(llama_bench: Path | None, options: Options, tokens: int, kv_fp16: int, workdir: Path, progress):
    """llama.cpp's rows (peers.Peer), or none and the note saying why."""

    from zenedge import bases
    from zenedge.bench import peers
    from zenedge.errors import BaseNotFound

    if llama_bench is None:
        return [], peers.SKIPPED
    if options.base_dir is not None:
        return [], "llama.cpp: skipped, --base-dir is not the model of the embedded GGUF"
    try:
        gguf = bases.default_base_gguf()
    except BaseNotFound as exc:
        return [], f"llama.cpp: skipped, {exc}"
    progress(f"llama.cpp: {llama_bench} on {gguf.name}")
    # its decode steps attend to 1..tokens positions
    kv_step = round(kv_fp16 * (tokens + 1) / 2)
    decode_threads = threads.policy().decide(single_step=True).threads   # llama.cpp decodes with as many
    return peers.prepare(llama_bench, gguf, decode_threads, tokens, kv_step, workdir, progress), None


def gemv_speeds(residents: dict, repeats: int) -> dict:
    """One decode step's matrix-vector products alone (batch 1, every linear weight once, in model
    order, so each weight comes from memory as in decode), per precision: torch's F.linear on the
    plain weights (fp32, bf16) and each resident's fast copies (packed bf16, int8, int4).
    Interleaved rounds, medians; GB/s counts the bytes the matmuls read."""
    import torch
    import torch.nn.functional as F

    from zenedge.runtime.layers import VariantLinear

    def matmuls(model, fast: bool):
        """[(x → y, in_features, bytes)] over the decoder linears and the head."""
        head = model.get_output_embeddings()
        out = []
        for module in [m for m in model.modules() if isinstance(m, VariantLinear)] + [head]:
            weight = module.weight
            if fast:
                if getattr(module, "fast", None) is None:
                    return []
                out.append((lambda x, f=module.fast: f.linear(x, None), weight.shape[1], module.fast.nbytes))
            else:
                out.append((lambda x, w=weight: F.linear(x, w), weight.shape[1], weight.numel() * weight.element_size()))
        return out

    sets = {f"{label} F.linear": (matmuls(residents[label].model, False), dtype)
            for label, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)) if label in residents}
    for label, name in (("bfloat16", "bfloat16 oneDNN packed"), ("int8", "int8 weight-only"),
                        ("int4", "int4 weight-only")):
        found = matmuls(residents[label].model, True) if label in residents else None
        if found:
            sets[name] = (found, residents[label].dtype)
    inputs = {(k, dtype): torch.randn(1, k, dtype=dtype) for ops, dtype in sets.values() for _, k, _ in ops}
    timings: dict[str, list[tuple[float, float]]] = {name: [] for name in sets}
    with torch.inference_mode():
        for round_ in range(repeats + 1):                 # round 0 warms up
            for name, (ops, dtype) in sets.items():
                start, cpu = time.perf_counter(), time.process_time()
                for op, k, _ in ops:
                    op(inputs[(k, dtype)])
                if round_:
                    timings[name].append((time.perf_counter() - start, time.process_time() - cpu))
    out = {}
    for name, (ops, _) in sets.items():
        nbytes = sum(b for _, _, b in ops)
        wall = statistics.median(t[0] for t in timings[name])
        cpu = statistics.median(t[1] for t in timings[name])
        out[name] = {"ms": 1e3 * wall, "cpu_ms": 1e3 * cpu, "bytes": nbytes, "gb_per_s": nbytes / wall / 1e9}
    return out


BATCH_ROWS = (1, 2, 4, 8, 16)
# The order mixed batches take their rows in: 8 rows are 4 LoRA + 2 BitDelta + 2 base; 16 are each twice.
_MIX = ("lora", "bitdelta", "base", "lora", "lora", "bitdelta", "base", "lora")


# Constrained decoding's rows: an array of at least 64 free strings cannot end within the run's
# tokens, so every row decodes all of them, each step masked (free strings are where the mask
# costs most: llguidance's lexer walks every token that may continue a string).
CONSTRAINED_SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 64}
CONSTRAINED = ", JSON schema"
CONSTRAINED_ROWS = 8


def constrained_cases(cases: list, resident, prompt: list[int], tokens: int, loras: list, deltas: list,
                      bytes_for) -> dict:
    """A constrained twin of one base row and of the mixed 8-row batch: {twin: its unconstrained case}.
    On `resident` as served (its real EOS: the grammar admits it only where the JSON may end)."""
    from zenedge.runtime.generate import GenerationRequest, SamplingParams
    from zenedge.runtime.grammar import Grammar

    grammar = Grammar.json_schema(CONSTRAINED_SCHEMA, "the bench's schema")
    twins = {}
    for rows in (1, CONSTRAINED_ROWS):
        variants = [None] if rows == 1 else mixed_rows(rows, loras, deltas)
        label = "base" if rows == 1 else describe_mix(variants)
        plain = next(c for c in cases if c.engine == "zenedge" and c.rows == rows and c.variant == label
                     and c.dtype == default_precision())
        requests = [GenerationRequest(prompt, v, SamplingParams(max_tokens=tokens, grammar=grammar)) for v in variants]
        distinct = list({id(v): v for v in variants}.values())
        twin = Case("zenedge", "zenedge", plain.dtype, rows, label + CONSTRAINED, zenedge_case(resident, requests),
                    bytes_for(plain.dtype, distinct, rows=rows))
        twins[twin] = plain
    return twins


def mixed_rows(rows: int, loras: list, deltas: list) -> list:
    """`rows` variants mixed as a daemon's batch meets them: LoRAs, BitDeltas and the base in the
    order _MIX gives, each kind's variants taken in turn."""
    taken = {"lora": 0, "bitdelta": 0}
    out = []
    for i in range(rows):
        kind = _MIX[i % len(_MIX)]
        if kind == "base":
            out.append(None)
            continue
        pool = loras if kind == "lora" else deltas
        out.append(pool[taken[kind] % len(pool)])
        taken[kind] += 1
    return out


def describe_mix(variants: list) -> str:
    from zenedge.runtime.variants import BitDeltaModule

    def kind(v):
        if v is None:
            return "base"
        return "BitDelta" if any(isinstance(m, BitDeltaModule) for m in v.modules.values()) else "LoRA"
    kinds = [kind(v) for v in variants]
    if len(set(kinds)) == 1:
        return "base" if kinds[0] == "base" else f"{kinds[0]} ×{len(kinds)}"
    return "mixed: " + " + ".join(f"{kinds.count(k)} {k}" for k in ("LoRA", "BitDelta", "base") if k in kinds)


def _summarise(case: Case, prompt_tokens: int, tokens: int, copy_bw: float) -> dict:
    prefill = statistics.median(t.prefill_wall for t in case.timings)
    rates = case.decode_rates(tokens)
    per_cpu = [rate * t.decode_wall / t.decode_cpu for rate, t in zip(rates, case.timings) if t.decode_cpu > 0]
    step_s = case.rows / statistics.median(rates)          # a step gives every row one token
    return {
        "name": case.name, "engine": case.engine, "dtype": case.dtype, "rows": case.rows, "variant": case.variant,
        "prefill_tokens_per_s": case.rows * prompt_tokens / prefill,
        "decode_tokens_per_s": statistics.median(rates),
        "decode_tokens_per_cpu_s": statistics.median(per_cpu) if per_cpu else float("nan"),
        "ms_per_step": 1e3 * step_s,
        "ms_per_step_best": 1e3 * case.rows / max(rates),
        "bytes_per_step": case.bytes_per_step,
        "bandwidth_fraction": bandwidth.ratio(case.bytes_per_step / step_s, copy_bw),
        "samples": len(case.timings),
    }


def _cold_loads(lora_dir: Path, delta_file: Path, resident, device, repeats: int, with_dense: bool = True) -> dict:
    """Seconds from a file on disk to a servable variant (and, for BitDelta, to dense weights,
    `with_dense`)."""
    from zenedge.bench.variants import load_lora_variant
    from zenedge.runtime.dense_bitdelta import densify
    from zenedge.runtime.variants import load_bitdelta

    lora, delta, dense = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        load_lora_variant("cold-lora", lora_dir, device, resident.dtype)
        lora.append(time.perf_counter() - start)
        start = time.perf_counter()
        variant = load_bitdelta("cold-delta", delta_file, device)
        delta.append(time.perf_counter() - start)
        if with_dense:
            start = time.perf_counter()
            densify(variant, resident.model)
            dense.append(time.perf_counter() - start)
    return {"lora": statistics.median(lora), "bitdelta": statistics.median(delta),
            "bitdelta_densify": statistics.median(dense) if dense else None}


def _switch_ms(cache, dense, resident, keys: list[str], count: int, device, policy: str = "always") -> float:
    """Milliseconds to get a cached variant ready for a batch, alternating between two: the cache
    lookup, the dense-copy check and the row grouping. No weights move: zenedge never merges an
    adapter into the base, so a switch is bookkeeping."""
    from zenedge.runtime.layers import RowVariants

    times = []
    for i in range(count):
        key = keys[i % len(keys)]
        start = time.perf_counter()
        variant = dense.prepare(cache.get(key, lambda: None), resident.model, policy)
        RowVariants.build([variant], device)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)
