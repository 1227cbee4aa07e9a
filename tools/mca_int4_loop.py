"""The int4 product's inner loop as gcc compiles it (AVX2 build), for the sources at each git commit
given (default: HEAD): the innermost loop holding VPMADDWD in `block` at 1 and at 4 rows of x, its
instructions, its stack references (spills and reloads) and llvm-mca's cycles per iteration
(-mcpu=znver3). Needs gcc and llvm-mca. Run from the repository root:
python -m tools.mca_int4_loop [COMMIT ...]."""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from zenedge.kernels import native

PROBE = """#include "int4_gemv.c"
__attribute__((noinline)) void probe(const uint8_t *c, const uint8_t *ahead, const uint16_t *s, const uint16_t *z,
                                     const x_rows *rows, int64_t K, float *y, int64_t N) {
    block(c, ahead, s, z, rows, K, 0, y, N, 0, MCV);
}
"""


def innermost_madd_loop(assembly: str) -> list[str]:
    lines = assembly.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("probe:"))
    end = next(i for i, line in enumerate(lines) if i > start and ".size\tprobe" in line)
    body = lines[start:end]
    labels = {line[:-1]: i for i, line in enumerate(body) if re.match(r"^\.L\w+:$", line)}
    loops = []
    for i, line in enumerate(body):
        jump = re.match(r"\s+j\w+\s+(\.L\w+)", line)
        if jump and jump.group(1) in labels and labels[jump.group(1)] < i:
            loop = [x for x in body[labels[jump.group(1)] + 1:i]
                    if x.strip() and not x.strip().startswith(".") and not re.match(r"^\.L", x)]
            if any("vpmaddwd" in x for x in loop):
                loops.append(loop)
    return min(loops, key=len)


def main() -> None:
    commits = sys.argv[1:] or ["HEAD"]
    print("int4_gemv.c's block(), AVX2 build: the innermost loop with VPMADDWD; llvm-mca -mcpu=znver3")
    for commit in commits:
        with tempfile.TemporaryDirectory() as work:
            work = Path(work)
            for name in ("lanes.h", "x_rows.h", "int4_gemv.c"):
                (work / name).write_text(subprocess.run(["git", "show", f"{commit}:kernels/native/{name}"], check=True,
                                                        capture_output=True, text=True).stdout)
            (work / "probe.c").write_text(PROBE)
            for rows in (1, 4):
                out = work / f"probe{rows}.s"
                subprocess.run(["gcc", "-O3", "-std=c11", "-ffp-contract=off", *native.ISA_FLAGS["avx2"], f"-DMCV={rows}",
                                f"-I{work}", "-S", str(work / "probe.c"), "-o", str(out)], check=True)
                loop = innermost_madd_loop(out.read_text())
                (work / "loop.s").write_text("\n".join(loop) + "\n")
                mca = subprocess.run(["llvm-mca", "-mcpu=znver3", "-iterations=100", str(work / "loop.s")],
                                     check=True, capture_output=True, text=True).stdout
                cycles = int(re.search(r"Total Cycles:\s+(\d+)", mca).group(1)) / 100
                madds = sum("vpmaddwd" in x for x in loop)
                stack = sum("(%rsp)" in x or "(%rbp)" in x for x in loop)
                print(f"{commit}, {rows} row(s) of x: {len(loop)} instructions, {madds} VPMADDWD, {stack} stack "
                      f"references, {cycles:.1f} cycles per iteration ({cycles / madds:.2f} per VPMADDWD)")


if __name__ == "__main__":
    main()
