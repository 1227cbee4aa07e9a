"""Compile every kernel config for sm_90a without a GPU and read the SASS.

For each (variant, config): registers, spill instructions (STL/LDL, must be 0), how wide the
global loads are (LDG/LDGSTS .128 = 16 bytes), whether tl.dot became HGMMA (wgmma) rather than
HMMA, and the steady-state K loop: instructions per thread per step and per weight of the tile
(per W element: a grouped step expands every slot's bits for it), CTA barriers, and how many
of its wgmma waits drain the tensor pipe to zero (`WARPGROUP.DEPBAR.LE gsb0, 0x0`: the MMA then
cannot overlap the next step's work). Uses the cuobjdump that ships inside the triton wheel.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import re
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from zenedge.kernels.bitdelta.configs import (DECODE_CONFIGS, DECODE_ROWS, GROUPED_DECODE_CONFIGS,
                                              GROUPED_PREFILL_CONFIGS, PREFILL_CONFIGS, KernelConfig,
                                              slots_per_program)

# (name, kernel, grouped, slots, configs). Grouped decode is shown for 8 deltas present (8 slots)
# and for the most a 16-row batch can hold (16 slots, MAX_DECODE_SLOTS).
VARIANTS = (
    ("decode", "decode", False, 1, DECODE_CONFIGS),
    ("decode-grouped", "decode", True, 8, GROUPED_DECODE_CONFIGS),
    ("decode-grouped16", "decode", True, 16, GROUPED_DECODE_CONFIGS[:1] + GROUPED_DECODE_CONFIGS[4:5]),
    ("prefill", "prefill", False, 1, PREFILL_CONFIGS),
    ("prefill-grouped", "prefill", True, 1, GROUPED_PREFILL_CONFIGS),
)

_POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "p_ptr": "*i32", "a_ptr": "*fp32", "bias_ptr": "*fp32",
             "y_ptr": "*bf16", "perm_ptr": "*i32", "seg_ptr": "*i32", "slot_ptr": "*i32", "ws_ptr": "*fp32",
             "cnt_ptr": "*i32"}
# Launches on model shapes (multiples of 16) get the other integers specialised as divisible by 16.
_NOT_DIVISIBLE = {"M", "NUM_SEG", "NSLOT"}


@dataclass(frozen=True)
class SassReport:
    variant: str
    config: KernelConfig
    registers: int
    spills: int                 # STL + LDL instructions
    wide_loads: int             # 16-byte global loads (LDG.E.128, LDGSTS ... .128)
    narrow_loads: dict          # other global load widths -> count
    hgmma: int
    hmma: int
    shared_bytes: int
    loop_instructions: int      # steady-state K loop, per thread per step
    loop_barriers: int          # BAR.SYNC in that loop
    loop_drains: int            # WARPGROUP.DEPBAR.LE gsb0, 0x0 in that loop
    weights_per_thread: float   # W elements per thread per K step

    @property
    def per_weight(self) -> float:
        return self.loop_instructions / self.weights_per_thread


def _tool(name: str) -> str:
    import triton
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


_INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9._]*)(.*)")


def _instructions(sass: str) -> list[tuple[int, str, str]]:
    found = []
    for line in sass.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            found.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return found


def _main_loop(instrs: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The largest loop (backward branch) holding an HGMMA: the K loop's steady state."""
    best: list = []
    for addr, op, rest in instrs:
        target = re.search(r"0x([0-9a-f]+)", rest)
        if op.startswith("BRA") and target and int(target.group(1), 16) < addr:
            body = [i for i in instrs if int(target.group(1), 16) <= i[0] <= addr]
            if any(o.startswith("HGMMA") for _, o, _ in body) and len(body) > len(best):
                best = body
    return best


def _signature(kernel, constexprs: dict) -> tuple[dict, dict]:
    names = kernel.arg_names
    signature = {n: "constexpr" if n in constexprs else _POINTERS.get(n, "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if signature[n] != "constexpr" and n not in _NOT_DIVISIBLE}
    return signature, attrs


def compile_one(variant: str, kind: str, grouped: bool, nslot: int, cfg: KernelConfig) -> SassReport:
    """Compile in this process; it must not run TRITON_INTERPRET=1 (use compile_reports otherwise)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from zenedge.kernels.bitdelta.fused_kernel import _decode_kernel, _prefill_kernel
    common = {"BLOCK_N": cfg.block_n, "BLOCK_M": cfg.block_m, "BLOCK_K": cfg.block_k, "GROUPED": grouped,
              "WORDS": True, "EVEN_K": True, "HAS_BIAS": False, "DOT_PRECISION": "tf32",
              "ASM": os.environ.get("ZENEDGE_SASS_ASM", "1") == "1"}
    if kind == "decode":
        slots = min(nslot, slots_per_program(cfg))
        kernel, constexprs = _decode_kernel, {**common, "SPLIT_K": cfg.split_k, "SLOTS": slots,
                                              "SLOT_GROUPS": -(-nslot // slots)}
    else:
        kernel, constexprs = _prefill_kernel, {**common, "SEG_P2": 16, "OFFSETS_64": False}
    signature, attrs = _signature(kernel, constexprs)
    src = ASTSource(kernel, signature, constexprs, attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([_tool("cuobjdump"), "--dump-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                               text=True, check=True).stdout
    instrs = _instructions(sass)
    ops = collections.Counter(op for _, op, _ in instrs)
    loop = _main_loop(instrs)
    loads = {op: c for op, c in ops.items() if op.startswith(("LDG", "LDGSTS")) and op != "LDGDEPBAR"}
    wide = sum(c for op, c in loads.items() if op.endswith(".128"))
    rows = cfg.block_n                       # W rows per tile, decode and prefill alike
    return SassReport(
        variant=variant, config=cfg,
        registers=int(re.search(r"REG:(\d+)", usage).group(1)),
        spills=sum(c for op, c in ops.items() if op.startswith(("STL", "LDL"))),
        wide_loads=wide, narrow_loads={op: c for op, c in loads.items() if not op.endswith(".128")},
        hgmma=sum(c for op, c in ops.items() if op.startswith("HGMMA")),
        hmma=sum(c for op, c in ops.items() if op.startswith("HMMA")),
        shared_bytes=int(compiled.metadata.shared),
        loop_instructions=len(loop),
        loop_barriers=sum(op.startswith("BAR.SYNC") for _, op, _ in loop),
        loop_drains=sum(op == "WARPGROUP.DEPBAR.LE" and "gsb0, 0x0" in rest for _, op, rest in loop),
        weights_per_thread=rows * cfg.block_k / (32 * cfg.num_warps),
    )


def _job(args):
    return compile_one(*args)


def _compiler_process() -> None:
    # Runs in each fresh worker before triton is imported there: @triton.jit (tl.cdiv, tl.sum
    # too) becomes an interpreter object when TRITON_INTERPRET=1, and those cannot compile.
    os.environ["TRITON_INTERPRET"] = "0"


def compile_reports(jobs: list[tuple], workers: int | None = None) -> list[SassReport]:
    """Compile (variant, kernel, grouped, slots, config) jobs in spawned worker processes."""
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_compiler_process) as pool:
        return list(pool.map(_job, jobs))


def all_reports(workers: int | None = None) -> list[SassReport]:
    jobs = [(name, kind, grouped, nslot, cfg) for name, kind, grouped, nslot, configs in VARIANTS for cfg in configs]
    return compile_reports(jobs, workers)


def _config_text(cfg: KernelConfig) -> str:
    if cfg.block_m <= DECODE_ROWS:
        text = f"N{cfg.block_n} M{cfg.block_m} K{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
    else:
        text = f"M{cfg.block_m} N{cfg.block_n} K{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
    text += f" splitK{cfg.split_k}" if cfg.split_k > 1 else ""
    return text + (f" slots{cfg.slots}" if cfg.slots else "")


def format_table(reports: list[SassReport]) -> str:
    header = ("| variant | config | regs | spills | 16B loads | narrower loads | HGMMA | HMMA | smem B | "
              "loop instr | instr/weight | loop BAR | loop drains |")
    lines = [header, "|" + "---|" * 13]
    for r in reports:
        narrow = ", ".join(f"{op}×{c}" for op, c in sorted(r.narrow_loads.items())) or "-"
        lines.append(f"| {r.variant} | {_config_text(r.config)} | {r.registers} | {r.spills} | {r.wide_loads} | "
                     f"{narrow} | {r.hgmma} | {r.hmma} | {r.shared_bytes} | {r.loop_instructions} | "
                     f"{r.per_weight:.2f} | {r.loop_barriers} | {r.loop_drains} |")
    clean = all(r.spills == 0 and r.hgmma > 0 and r.hmma == 0 for r in reports)
    lines.append("")
    lines.append(f"clean (no spills, every dot on HGMMA): {'yes' if clean else 'NO'}")
    return "\n".join(lines)
