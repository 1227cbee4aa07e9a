"""`zenedge doctor`: what this machine and this pool look like, and what to fix first."""

from __future__ import annotations

import importlib.util
import platform
import shutil
import sys
from pathlib import Path

import click

from zenedge.cli.output import json_option, print_json, print_table


def _checks() -> list[dict]:
    from zenedge import config, paths
    from zenedge.errors import ZenedgeError

    results = []

    def add(name: str, status: str, detail: str) -> None:
        results.append({"check": name, "status": status, "detail": detail})

    add("python", "ok" if sys.version_info >= (3, 10) else "fail", platform.python_version())
    try:
        cfg = config.load(paths.config_path())
        add("config", "ok", str(cfg.path) + ("" if cfg.path.exists() else " (not created yet: defaults)"))
    except ZenedgeError as exc:
        add("config", "fail", str(exc))
        cfg = None
    for package in ("torch", "transformers", "peft", "safetensors", "tokenizers", "triton", "gguf", "kernels"):
        spec = importlib.util.find_spec(package)
        missing = {"triton": "warn", "kernels": "ok"}.get(package, "fail")   # kernels: transformers' optional hub kernels
        add(package, "ok" if spec else missing, _version(package) if spec else "not installed")
    add("tested versions", *_against_the_lock())
    try:
        import torch

        cuda = torch.cuda.is_available()
        add("device", "ok", f"cuda: {torch.cuda.get_device_name(0)}" if cuda else "cpu (no CUDA device)")
    except Exception as exc:  # a broken torch install is exactly what doctor is for
        add("device", "fail", str(exc))
    if cfg is not None:
        try:
            from zenedge.runtime.device import pick_device, pick_dtype, pick_weights

            device = pick_device(cfg.runtime.device)
            dtype = str(pick_dtype(cfg.runtime.dtype, device)).replace("torch.", "")
            weights = pick_weights(cfg.runtime.weights, device)
            add("runtime", "ok", f"{device.type}, {dtype} activations, {weights} weights")
        except ZenedgeError as exc:
            add("runtime", "fail", str(exc))
        else:
            for name, status, detail in _decode_paths(cfg, device, weights):
                add(name, status, detail)
            try:
                add("threads", "ok", _threads_line(cfg, device, weights))
            except ZenedgeError as exc:   # ZENEDGE_THREADS malformed
                add("threads", "fail", str(exc))
    from zenedge import bases

    try:
        add("default base", "ok", str(bases.default_base_gguf()))
    except ZenedgeError as exc:
        add("default base", "fail", str(exc))
    home = paths.home()
    add("home", "ok", str(home))
    if home.exists():
        free = shutil.disk_usage(home).free
        add("disk", "ok" if free > 2 * 2**30 else "warn", f"{free / 2**30:.1f} GiB free")
        from zenedge.store import Store

        store = Store(home)
        problems = store.check(budget=cfg.budget if cfg else None)
        add("pool", "ok" if not problems else "fail", "consistent" if not problems else "; ".join(problems[:3]))
    try:
        from zenedge.registry.sources import embedded_root

        count = len(__import__("json").loads((embedded_root() / "index.json").read_text())["profiles"])
        add("embedded registry", "ok", f"{count} profiles")
    except Exception as exc:
        add("embedded registry", "warn", str(exc))
    return results


def _decode_paths(cfg, device, weights: str) -> list[tuple[str, str, str]]:
    """(check, status, detail) for each base's decode path: the running daemon's, as it reports
    it, else what this machine's runtime would pick for each base in the pool (its model classes
    read without its weights)."""
    from dataclasses import asdict

    from zenedge import paths
    from zenedge.cli.daemon import find_daemon

    client = find_daemon(cfg)
    if client is not None:
        ps = client.ps()
        found = [(f"decode path ({base['name']}, daemon)", *_path_line(base["decode"], ps["device"]))
                 for base in ps["bases"] if base.get("decode")]
        return found or [("decode path", "ok", "the daemon has no base loaded yet")]
    from zenedge.runtime.decode import decode_path
    from zenedge.runtime.model import skeleton
    from zenedge.store import Store

    home = paths.home()
    stored = Store(home).bases() if home.exists() else []
    found = []
    for base in stored:
        path = decode_path(skeleton(home / base["dir"]), device, weights)
        found.append((f"decode path ({base['name']})", *_path_line(asdict(path), device.type)))
    if found:
        return found
    detail, slow = f"{weights} weights", False
    if device.type == "cpu":
        from zenedge.kernels import native

        isa, why = native.in_use()
        detail += f", native kernels on ({_isa_text(isa, why)})" if isa else f", native kernels off ({why})"
        slow = isa is None
    return [("decode path", "warn" if slow else "ok",
             detail + "; no base in the pool yet: its forward is decided by its model classes")]


def _threads_line(cfg, device, weights: str) -> str:
    """torch's CPU threads: the running daemon's, as it reports them, else this process's policy."""
    from zenedge.cli.daemon import find_daemon

    client = find_daemon(cfg)
    report = client.ps().get("threads") if client is not None else None
    if report is None:
        from zenedge.kernels import native
        from zenedge.runtime import threads

        native_steps = device.type == "cpu" and weights in ("int4", "int8") and native.off_reason() is None
        report = threads.configure(cfg.runtime.threads).report(single_step=native_steps)
    line = f"{report['setting']}" + (f" ({report['source']})" if report["setting"] != "auto" else "")
    line += f"; {report['cores']} usable cores (by {report['cores_limited_by']}); prompts and scoring: " \
            f"{report['wide']} ({report['wide_why']})"
    if report.get("decode") is not None:
        line += f"; decode steps: {report['decode']} ({report['decode_why']})"
    return line


def _path_line(path: dict, device: str) -> tuple[str, str]:
    """(status, detail) of one decode path (runtime.decode.DecodePath as a dict): a warning where
    decoding runs slower than it could here."""
    native = f"native kernels on ({_isa_text(path.get('native_isa'), path.get('native_isa_why'))})" \
        if path["native_kernels"] else f"native kernels off ({path['native_kernels_off']})"
    detail = f"{path['stepper']} stepper, {path['forward']} forward, {path['weights']} weights"
    if device.startswith("cpu"):
        detail += f", {native}"
    if path["lean_refused"]:
        detail += f"; lean forward refused: {path['lean_refused']}"
    if path.get("c_step_fallback"):
        detail += f"; the latest batch ran the Python step: {path['c_step_fallback']}"
    slow = path["lean_refused"] or (device.startswith("cpu") and not path["native_kernels"])
    return "warn" if slow else "ok", detail


def _isa_text(isa: str | None, why: str | None) -> str:
    """'avx2: the CPU has avx2, fma, f16c; not avx512_bf16' (an older daemon reports no instruction set)."""
    return f"{isa}: {why}" if isa else "instruction set not reported"


# The lock of the versions the test suite last passed with: the checkout's constraints.txt (an
# editable install, as the README makes); a wheel carries none.
LOCK = Path(__file__).resolve().parents[2] / "constraints.txt"


def _against_the_lock(lock: Path = LOCK) -> tuple[str, str]:
    """(status, detail): the installed distributions whose versions differ from the lock's pins."""
    from importlib.metadata import PackageNotFoundError, version

    if not lock.is_file():
        return "ok", "no lock beside this installation (constraints.txt comes with a checkout)"
    pins = [line.split("==", 1) for line in lock.read_text().splitlines()
            if "==" in line and not line.lstrip().startswith("#")]
    checked, outside = 0, []
    for name, pinned in pins:
        try:
            installed = version(name.strip())
        except PackageNotFoundError:
            continue    # pinned for a platform or an extra this install does not have
        checked += 1
        if installed != pinned.strip():
            outside.append(f"{name.strip()} {installed} (tested: {pinned.strip()})")
    if outside:
        return "warn", (f"{len(outside)} of {checked} outside the tested lock {lock}: " + ", ".join(outside)
                        + "; `pip install -c constraints.txt -e .` in the checkout installs the tested ones")
    return "ok", f"all {checked} installed packages as in {lock}"


def _version(package: str) -> str:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:
        return "installed"


@click.command("doctor")
@json_option
def doctor(json_out: bool) -> None:
    """Check the installation, the config, the default base, the pool and each base's decode path."""
    results = _checks()
    if json_out:
        print_json(results)
    else:
        print_table([(r["check"], r["status"], r["detail"]) for r in results], ["CHECK", "STATUS", "DETAIL"])
    if any(r["status"] == "fail" for r in results):
        raise click.exceptions.Exit(1)
