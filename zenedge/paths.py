"""Where things live. The only module that reads zenedge's environment variables.

ZENEDGE_HOME    the pool (blobs, index, bases)     default: platformdirs user data dir
ZENEDGE_CONFIG  the TOML config file               default: platformdirs user config dir/config.toml
ZENEDGE_TOKEN   bearer token for the TCP listener  default: a generated 0600 file in the home
ZENEDGE_NATIVE_KERNELS  0 turns off the C kernels for the CPU (kernels/native/)  default: on
ZENEDGE_CPU_ISA         avx512vnni, avx512, avx2, neon, scalar or off: the C kernels' instruction set  default: the best this CPU runs
CC                      the C compiler that builds them  default: cc, else gcc
ZENEDGE_LLAMA_BENCH     a built llama.cpp `llama-bench`, a peer row in `zenedge bench run`  default: none
ZENEDGE_KEEP_ALIVE      seconds; overrides the config's server.keep_alive (0: the CLI never starts a daemon)
ZENEDGE_THREADS         "auto" or N; overrides the config's runtime.threads (runtime/threads.py)
OMP_NUM_THREADS         read, not set: a cap on what "auto" threads may use (as torch takes it)
ZENEDGE_KERNEL_NO_SPLIT_K  set: the CUDA BitDelta kernels never split K (a driver found unsafe with it)
ZENEDGE_REGISTRY_LOG    set: `zenedge registry serve` logs every request
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
from pathlib import Path

import platformdirs

APP = "zenedge"


def home() -> Path:
    value = os.environ.get("ZENEDGE_HOME")
    return Path(value).expanduser() if value else Path(platformdirs.user_data_dir(APP))


def config_path() -> Path:
    value = os.environ.get("ZENEDGE_CONFIG")
    return Path(value).expanduser() if value else Path(platformdirs.user_config_dir(APP)) / "config.toml"


def cli_command(*args: str) -> list[str]:
    """The argv that runs zenedge's CLI in a child process (the daemon, the benches' commands).
    `-P`: the child imports zenedge and its dependencies from the installation only, never from its
    working directory (a clone's root holds folders named like packages that dependencies import)."""
    return [sys.executable, "-P", "-m", "zenedge.cli", *args]


def kernel_cache() -> Path:
    """Where compiled CPU kernels are kept: per machine and user, not per pool."""
    return Path(platformdirs.user_cache_dir(APP)) / "kernels"


def native_kernels_enabled() -> bool:
    return os.environ.get("ZENEDGE_NATIVE_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")


def cpu_isa() -> str | None:
    """ZENEDGE_CPU_ISA, lower-cased, or None where unset (kernels/native chooses then)."""
    value = os.environ.get("ZENEDGE_CPU_ISA", "").strip().lower()
    return value or None


def c_compiler() -> str | None:
    """The C compiler that builds the CPU kernels: CC, else cc, else gcc (None: none found)."""
    return shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")


def llama_bench() -> Path | None:
    """llama.cpp's `llama-bench` for `zenedge bench run` (`--llama-bench` wins over it)."""
    value = os.environ.get("ZENEDGE_LLAMA_BENCH", "").strip()
    return Path(value).expanduser() if value else None


def runtime_dir() -> Path:
    """A private per-user directory for the daemon's socket (XDG_RUNTIME_DIR where there is one).

    The default home's daemon lives at <XDG_RUNTIME_DIR>/zenedge (what desktop apps look for); a
    home set with ZENEDGE_HOME gets a subdirectory of its own, so two pools never share a socket.
    Both levels are made 0700 here (and tightened if an older version left them open), so nobody
    else can list which pools have daemons.
    """
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and Path(base).is_dir():
        root = _private_dir(Path(base) / APP)
        if os.environ.get("ZENEDGE_HOME"):
            digest = hashlib.sha256(str(home().resolve()).encode()).hexdigest()[:12]
            return _private_dir(root / digest)
        return root
    # No session runtime dir (containers, macOS): keep the socket inside the home, which is ours.
    return home() / "run"


def _private_dir(path: Path) -> Path:
    """Make `path` 0700 (creating it), tightening it when it is ours. Failures are left to the
    daemon, which refuses a socket directory it cannot trust when it binds."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and info.st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError:
        pass
    return path


def token_from_env() -> str | None:
    return os.environ.get("ZENEDGE_TOKEN") or None


def keep_alive_from_env() -> float | None:
    """ZENEDGE_KEEP_ALIVE as seconds, or None when unset (then the config's server.keep_alive holds)."""
    value = os.environ.get("ZENEDGE_KEEP_ALIVE", "").strip()
    if not value:
        return None
    from zenedge.durations import parse_keep_alive
    from zenedge.errors import InvalidInput

    try:
        return parse_keep_alive(float(value))
    except (ValueError, InvalidInput) as exc:   # inf, nan, 1e400, 1e-9, "soon"
        reason = str(exc) if isinstance(exc, InvalidInput) else "expected a number of seconds"
        raise InvalidInput(f"ZENEDGE_KEEP_ALIVE={value!r}: {reason}") from None


def threads_from_env() -> int | str | None:
    """ZENEDGE_THREADS as "auto" or a count ≥ 1, or None when unset (runtime.threads holds)."""
    value = os.environ.get("ZENEDGE_THREADS", "").strip().lower()
    if not value:
        return None
    if value == "auto":
        return value
    if not value.isdigit() or not 1 <= int(value) <= 1024:
        from zenedge.errors import InvalidInput

        raise InvalidInput(f"ZENEDGE_THREADS={value!r} is neither \"auto\" nor a thread count from 1 to 1024")
    return int(value)


def omp_threads_from_env() -> int | None:
    """OMP_NUM_THREADS as a count, where it is set to one (OpenMP's own syntax allows lists)."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


def split_k_disabled() -> bool:
    """ZENEDGE_KERNEL_NO_SPLIT_K is set: kernels/bitdelta/autotune.py leaves out split-K configs."""
    return bool(os.environ.get("ZENEDGE_KERNEL_NO_SPLIT_K"))


def registry_log_requests() -> bool:
    """ZENEDGE_REGISTRY_LOG is set: the registry's file server logs each request (quiet otherwise)."""
    return bool(os.environ.get("ZENEDGE_REGISTRY_LOG"))


def scratch_environment(root: str | Path, config: str) -> dict[str, str]:
    """This process's environment pointed at a throwaway zenedge under `root`: its own home, config
    file (written with `config`) and socket directory, no daemon kept alive, so a benchmark's child
    processes never touch the user's pool or daemon."""
    env = {**os.environ, "ZENEDGE_HOME": f"{root}/home", "ZENEDGE_CONFIG": f"{root}/config.toml",
           "XDG_RUNTIME_DIR": f"{root}/run", "ZENEDGE_KEEP_ALIVE": "0"}
    Path(env["XDG_RUNTIME_DIR"]).mkdir(mode=0o700)
    Path(env["ZENEDGE_CONFIG"]).write_text(config)
    return env
