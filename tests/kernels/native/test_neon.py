"""The ARM64 NEON build of the C kernels, and clang's builds, give the scalar reference's bits (NEON under qemu).

parity_driver.c runs every kernel on inputs it makes itself and prints the outputs' bits. It is
built twice: for this machine with no instruction-set flags (the scalar reference), and for ARM64
with ZENEDGE_NEON by Debian's cross compiler, run under qemu-user. Emulation says nothing of
speed, only of the numbers. .ci/run installs the tools (gcc-aarch64-linux-gnu, qemu-user-static).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from zenedge.kernels import native

HERE = Path(__file__).parent
CROSS, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64-static"
FLAGS = [flag for flag in native.FLAGS if flag not in ("-shared", "-fPIC")]


def _driver(compiler: str, target: Path, *flags: str) -> Path:
    sources = [str(HERE / "parity_driver.c"), *map(str, native.SOURCES)]
    subprocess.run([compiler, *FLAGS, *flags, f"-I{native.PROBE.parent}", "-o", str(target), *sources, "-lm"],
                   check=True, capture_output=True, text=True, timeout=300)
    return target


def _outputs(command: list[str]) -> dict[str, str]:
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


@pytest.mark.skipif(native.paths.c_compiler() is None, reason="no C compiler")
def test_the_driver_covers_every_kernel(tmp_path):
    outputs = _outputs([str(_driver(native.paths.c_compiler(), tmp_path / "scalar"))])
    kernels = {name.split("-")[0] for name in outputs}
    assert kernels == {"int4", "int4x8", "int8", "rms_norm", "attention", "lora", "signs", "sign_dense", "silu_mul"}
    assert all(len(bits.split()) > 0 for bits in outputs.values())


@pytest.mark.skipif(shutil.which(CROSS) is None or shutil.which(QEMU) is None,
                    reason=f"no {CROSS} or {QEMU} (apt-get install gcc-aarch64-linux-gnu qemu-user-static)")
@pytest.mark.skipif(native.paths.c_compiler() is None, reason="no C compiler")
def test_neon_gives_the_scalar_references_bits(tmp_path):
    reference = _outputs([str(_driver(native.paths.c_compiler(), tmp_path / "scalar"))])
    neon = _outputs([QEMU, str(_driver(CROSS, tmp_path / "neon", "-static", "-DZENEDGE_NEON"))])
    assert neon.keys() == reference.keys()
    for name, bits in reference.items():
        assert neon[name] == bits, f"neon {name} differs from the scalar reference"


@pytest.mark.skipif(shutil.which("clang") is None, reason="no clang (macOS builds the kernels with it)")
@pytest.mark.skipif(native.paths.c_compiler() is None, reason="no C compiler")
def test_clang_builds_give_the_scalar_references_bits(tmp_path):
    """macOS compiles with clang: every build this CPU runs, and the CPU probe, compile with it, and
    the kernels give the same bits as the default compiler's scalar build."""
    reference = _outputs([str(_driver(native.paths.c_compiler(), tmp_path / "scalar"))])
    for name in native.runnable_isas():
        flags = native.ISA_FLAGS[name]
        built = _outputs([str(_driver("clang", tmp_path / f"clang-{name}", *flags))])
        assert built == reference, f"clang's {name} build differs from the scalar reference"
    subprocess.run(["clang", *native.FLAGS, "-o", str(tmp_path / "probe.so"), str(native.PROBE)], check=True,
                   capture_output=True, text=True, timeout=120)
