"""Compile every kernel config for sm_90a without a GPU and read the SASS.

For each (variant, config): registers, spill instructions (STL/LDL, must be 0), how wide the
global loads of the main loop are (LDG/LDGSTS .128 = 16 bytes), and whether tl.dot became
HGMMA (wgmma) rather than HMMA. Uses the cuobjdump that ships inside the triton wheel.
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

from .configs import DECODE_CONFIGS, GROUPED_DECODE_CONFIGS, PREFILL_CONFIGS, KernelConfig

# (name, ROW_MODE, NSLOT, configs): decode grouped is shown for 8 deltas + base rows (9 slots,
# MAX_DECODE_SLOTS); decode batches with more distinct deltas use the tiles layout.
VARIANTS = (
    ("decode", 0, 1, DECODE_CONFIGS),
    ("decode-grouped", 2, 9, GROUPED_DECODE_CONFIGS),
    ("decode-grouped-tiles", 1, 1, GROUPED_DECODE_CONFIGS[:1]),
    ("prefill", 0, 1, PREFILL_CONFIGS),
    ("prefill-grouped", 1, 1, PREFILL_CONFIGS),
)

_POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "p_ptr": "*u8", "a_ptr": "*fp32", "bias_ptr": "*fp32",
             "y_ptr": "*bf16", "perm_ptr": "*i32", "seg_ptr": "*i32", "slot_ptr": "*i32", "ws_ptr": "*fp32",
             "cnt_ptr": "*i32"}
_INTS = ("M", "N", "K", "KB", "NUM_SEG", "stride_xm", "stride_wn", "stride_pd", "stride_pn", "stride_ad",
         "stride_ym")
# Launches on model shapes (multiples of 16) get these specialised as divisible by 16.
_NOT_DIVISIBLE = {"M", "NUM_SEG"}


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


def _tool(name: str) -> str:
    import triton
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def _count_ops(sass: str) -> collections.Counter:
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9._]*)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def compile_one(variant: str, row_mode: int, nslot: int, cfg: KernelConfig) -> SassReport:
    """Compile in this process; it must not run TRITON_INTERPRET=1 (use compile_reports otherwise)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .fused_kernel import _bitdelta_kernel
    names = _bitdelta_kernel.arg_names
    signature = {name: _POINTERS.get(name, "i32" if name in _INTS else "constexpr") for name in names}
    constexprs = {"BLOCK_N": cfg.block_n, "BLOCK_M": cfg.block_m, "BLOCK_K": cfg.block_k, "SPLIT_K": cfg.split_k,
                  "ROW_MODE": row_mode, "NSLOT": nslot, "SEG_P2": 16, "HAS_BIAS": False, "DOT_PRECISION": "tf32"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
             if signature[name] != "constexpr" and name not in _NOT_DIVISIBLE}
    src = ASTSource(_bitdelta_kernel, signature, constexprs, attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([_tool("cuobjdump"), "--dump-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                               text=True, check=True).stdout
    ops = _count_ops(sass)
    loads = {op: c for op, c in ops.items() if op.startswith(("LDG", "LDGSTS")) and op != "LDGDEPBAR"}
    wide = sum(c for op, c in loads.items() if op.endswith(".128"))
    return SassReport(
        variant=variant, config=cfg,
        registers=int(re.search(r"REG:(\d+)", usage).group(1)),
        spills=sum(c for op, c in ops.items() if op.startswith(("STL", "LDL"))),
        wide_loads=wide, narrow_loads={op: c for op, c in loads.items() if not op.endswith(".128")},
        hgmma=sum(c for op, c in ops.items() if op.startswith("HGMMA")),
        hmma=sum(c for op, c in ops.items() if op.startswith("HMMA")),
        shared_bytes=int(kernel.metadata.shared),
    )


def _job(args):
    return compile_one(*args)


def _compiler_process() -> None:
    # Runs in each fresh worker before triton is imported there: @triton.jit (tl.cdiv, tl.sum
    # too) becomes an interpreter object when TRITON_INTERPRET=1, and those cannot compile.
    os.environ["TRITON_INTERPRET"] = "0"


def compile_reports(jobs: list[tuple], workers: int | None = None) -> list[SassReport]:
    """Compile (variant, row_mode, nslot, config) jobs in spawned worker processes."""
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_compiler_process) as pool:
        return list(pool.map(_job, jobs))


def all_reports(workers: int | None = None) -> list[SassReport]:
    jobs = [(name, mode, nslot, cfg) for name, mode, nslot, configs in VARIANTS for cfg in configs]
    return compile_reports(jobs, workers)


def _config_text(cfg: KernelConfig) -> str:
    text = f"N{cfg.block_n} M{cfg.block_m} K{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
    return text + (f" splitK{cfg.split_k}" if cfg.split_k > 1 else "")


def format_table(reports: list[SassReport]) -> str:
    header = "| variant | config | regs | spills | 16B loads | narrower loads | HGMMA | HMMA | smem B |"
    lines = [header, "|" + "---|" * 9]
    for r in reports:
        narrow = ", ".join(f"{op}×{c}" for op, c in sorted(r.narrow_loads.items())) or "-"
        lines.append(f"| {r.variant} | {_config_text(r.config)} | {r.registers} | {r.spills} | {r.wide_loads} | "
                     f"{narrow} | {r.hgmma} | {r.hmma} | {r.shared_bytes} |")
    clean = all(r.spills == 0 and r.hgmma > 0 and r.hmma == 0 for r in reports)
    lines.append("")
    lines.append(f"clean (no spills, every dot on HGMMA): {'yes' if clean else 'NO'}")
    return "\n".join(lines)
