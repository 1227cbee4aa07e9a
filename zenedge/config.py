"""The TOML config file: typed settings, validation with file/line/key in every error, and safe edits.

Each table of the file is a frozen dataclass (`PoolSettings`, `RuntimeSettings`, `ServerSettings`,
`RegistrySettings`) whose fields carry their parser, documented default and doc (`setting`);
`SCHEMA` is read from them. `load` validates once and code reads attributes (`cfg.pool.budget`),
never string keys. Unknown keys are errors, not silently ignored, because a typo in `budget`
must never leave a user with the default.
Edits go through tomlkit so the user's comments and other keys survive, and are written atomically.
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from zenedge import paths
from zenedge.errors import ConfigError, InvalidInput
from zenedge.durations import parse_keep_alive, parse_seconds
from zenedge.sizes import parse_size


def _size(v: Any) -> int:
    return parse_size(v)


def parse_budget(v: Any) -> int:
    """The storage budget B: a size, and not 0 (a zero budget would evict every adapter; removing
    profiles is what `zenedge rm` is for). Checked before any eviction."""
    size = parse_size(v)
    if size == 0:
        raise InvalidInput("a budget of 0 bytes would evict every adapter",
                           hint="remove profiles with `zenedge rm NAME` instead")
    return size


def _int_at_least(low: int) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise InvalidInput(f"expected an integer ≥ {low}, got {v!r}")
        return v
    return parse


def _fraction(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
        raise InvalidInput(f"expected a number between 0 and 1, got {v!r}")
    return float(v)


def _merge_rank(v: Any) -> str | int:
    if v == "member":
        return v
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
        return v
    raise InvalidInput(f'expected "member" or an integer ≥ 1, got {v!r}')


def _threads(v: Any) -> str | int:
    if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024):
        return v
    raise InvalidInput(f'expected "auto" or a thread count from 1 to 1024, got {v!r}')


def _choice(*options: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        if v not in options:
            raise InvalidInput(f"expected one of {', '.join(map(repr, options))}, got {v!r}")
        return v
    return parse


def _string(v: Any) -> str:
    if not isinstance(v, str):
        raise InvalidInput(f"expected a string, got {v!r}")
    return v


def _strings(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise InvalidInput(f"expected a list of strings, got {v!r}")
    return tuple(v)  # settings are frozen: a list would let a caller change the config in force


def _tcp(v: Any) -> str:
    v = _string(v)
    if v and not re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}", v):
        raise InvalidInput(f'expected "HOST:PORT" (e.g. "127.0.0.1:11435") or "", got {v!r}')
    return v


@dataclass(frozen=True)
class Key:
    parse: Callable[[Any], Any]
    default: Any        # as a user would write it in the file
    doc: str


def setting(parse: Callable[[Any], Any], default: Any, doc: str) -> Any:
    """One key of a section: its parser, its documented default (parsed here), and what it does."""
    return field(default=parse(default), metadata={"key": Key(parse, default, doc)})


# The defaults are the documented ones (DESIGN.md "Config file").
@dataclass(frozen=True)
class PoolSettings:
    budget: int = setting(parse_budget, "4GiB", "storage budget B for adapters and deltas (bases are separate)")
    max_adapters: int = setting(_int_at_least(1), 8, "slot limit: stored adapters at most")
    quality_threshold: float = setting(_fraction, 0.7, "minimum retention a merge must keep for every member")
    merge_rank: str | int = setting(_merge_rank, "member", '"member" (largest member\'s rank) or a fixed rank cap')
    on_no_merge: str = setting(_choice("least-loss", "evict", "refuse"), "least-loss",
                               "when no merge passes the gate: the best merge or eviction, whichever loses less; "
                               "evict; or refuse")
    slot_threshold: float = setting(_fraction, 0.0,
                                    "K-Merge++: take a free slot only if similarity to all < this (0 = off)")
    maintain_interval: float = setting(parse_seconds, 600.0, "seconds between background maintenance runs (0 = off)")
    store_dtype: str = setting(_choice("bf16", "given"), "bf16",
                               'how import and pull store float32 LoRA adapters: "bf16" (half the bytes) or as given')
    compress_to: str = setting(_choice("int4", "int8", "bf16", "off"), "int4",
                               "the smallest format the pool re-stores adapters in before it merges any "
                               '("off": merge only)')
    compress_threshold: float = setting(_fraction, 0.98,
                                        "minimum retention a re-stored (compressed) adapter must keep for its profiles")


@dataclass(frozen=True)
class RuntimeSettings:
    device: str = setting(_choice("auto", "cpu", "cuda"), "auto", "where inference runs")
    dtype: str = setting(_choice("auto", "float32", "bfloat16", "float16"), "auto", "weights dtype")
    weights: str = setting(_choice("auto", "full", "int8", "int4"), "auto",
                           'CPU matmul weights: "full" or weight-only "int8" / "int4" copies')
    activations: str = setting(_choice("int16", "int8"), "int16",
                               'how the int4 kernel rounds inputs: "int16", or "int8" (prefill and scoring about '
                               'twice as fast at 1-8B, answer losses about 1 % higher)')
    cache_budget: int = setting(_size, "2GiB", "memory for cached variants")
    bitdelta_dense: str = setting(_choice("auto", "never", "always"), "auto",
                                  'dense W + α⊙S copies of BitDelta variants on the CPU: "auto" (only where the '
                                  'packed 1-bit path has no C kernel), "never", or "always" (while the cache has room)')
    threads: str | int = setting(_threads, "auto", 'CPU threads for torch: "auto" (one per core other work leaves '
                                                  'free; decode steps on the C kernels: one) or a fixed count')
    pinned: tuple[str, ...] = setting(_strings, [], "profile names never evicted from the pool or the cache")


@dataclass(frozen=True)
class ServerSettings:
    socket: str = setting(_string, "", "Unix socket path (empty: <runtime dir>/zenedge.sock)")
    tcp: str = setting(_tcp, "", 'optional loopback TCP listener, e.g. "127.0.0.1:11435"')
    tcp_auth: str = setting(_choice("token", "loopback"), "token",
                            '"token": every TCP request but /health sends the bearer token; "loopback": a client '
                            "on 127.0.0.1 or ::1 needs none (Ollama's way: any local program may then use the "
                            "daemon; the Host and Origin checks still keep web pages out)")
    cors_origins: tuple[str, ...] = setting(_strings, ["tauri://localhost", "http://tauri.localhost",
                                                       "https://tauri.localhost"], "origins allowed by CORS")
    max_queue: int = setting(_int_at_least(1), 64, "queued generation requests before 503")
    keep_alive: float = setting(parse_keep_alive, 300, "seconds a daemon that `pull`, `import` or `run` started "
                                               "stays up with nothing to do (0: they never start one)")


@dataclass(frozen=True)
class RegistrySettings:
    urls: tuple[str, ...] = setting(_strings, ["embedded"],
                                    'registries in resolution order ("embedded" or http(s) URLs)')


SECTIONS: dict[str, type] = {"pool": PoolSettings, "runtime": RuntimeSettings, "server": ServerSettings,
                             "registry": RegistrySettings}
# section → key → Key: what validation, the error hints and the docs read.
SCHEMA: dict[str, dict[str, Key]] = {name: {f.name: f.metadata["key"] for f in fields(section)}
                                     for name, section in SECTIONS.items()}


@dataclass(frozen=True)
class Config:
    """The config in force: one typed, frozen section per table of the file."""

    path: Path
    pool: PoolSettings = field(default_factory=PoolSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    registry: RegistrySettings = field(default_factory=RegistrySettings)

    @property
    def budget(self) -> int:
        return self.pool.budget

    def changes(self, other: Config) -> list[str]:
        """The keys ("section.key") whose values differ between `other` and this config."""
        return [f"{section}.{key}" for section in SECTIONS for key in SCHEMA[section]
                if getattr(getattr(self, section), key) != getattr(getattr(other, section), key)]


def _line_of(text: str, section: str, key: str | None) -> int | None:
    """Best-effort line number of `[section] key` in the raw text (tomllib gives none)."""
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.match(r"^\[\s*([A-Za-z0-9_.-]+)\s*\]", stripped)
        if header:
            current = header.group(1)
            if key is None and current == section:
                return number
            continue
        if key is not None and current == section and re.match(rf"^{re.escape(key)}\s*=", stripped):
            return number
        if key is not None and current is None and re.match(rf"^{re.escape(section)}\.{re.escape(key)}\s*=", stripped):
            return number
    return None


def _where(path: Path, text: str, section: str, key: str | None = None) -> str:
    line = _line_of(text, section, key)
    name = f"{section}.{key}" if key else f"[{section}]"
    return f"{path}:{line}: {name}" if line else f"{path}: {name}"


def validate(raw: dict[str, Any], path: Path, text: str = "") -> Config:
    """Check a parsed TOML document against SCHEMA; return the config, defaults filled in."""
    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    for section, table in raw.items():
        if section not in SCHEMA:
            close = difflib.get_close_matches(section, SCHEMA, n=1)
            hint = f"did you mean [{close[0]}]?" if close else f"sections are {', '.join(SCHEMA)}"
            raise ConfigError(f"{_where(path, text, section)}: unknown section", hint=hint)
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {section} must be a table ([{section}])")
        for key, value in table.items():
            spec = SCHEMA[section].get(key)
            if spec is None:
                close = difflib.get_close_matches(key, SCHEMA[section], n=1)
                hint = f"did you mean {close[0]}?" if close else f"keys are {', '.join(SCHEMA[section])}"
                raise ConfigError(f"{_where(path, text, section, key)}: unknown key", hint=hint)
            try:
                values[section][key] = spec.parse(value)
            except InvalidInput as exc:
                raise ConfigError(f"{_where(path, text, section, key)}: {exc}") from None
    return Config(path, **{section: SECTIONS[section](**keys) for section, keys in values.items()})


def load(path: Path | None = None) -> Config:
    """Read and validate the config; a missing file means all defaults."""
    path = path or paths.config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}", hint="fix the file or remove it to use the defaults") from None
    return validate(raw, path, text)


def set_value(section: str, key: str, value: Any, path: Path | None = None) -> Config:
    """Set one key, keeping the user's comments and other keys; validate before writing, atomically."""
    import tomlkit  # only edits need it

    path = path or paths.config_path()
    current = load(path)  # refuses to edit a file that is already broken
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    document = tomlkit.parse(text)
    if section not in document:
        document[section] = tomlkit.table()
    document[section][key] = value
    new_text = tomlkit.dumps(document)
    validate(tomllib.loads(new_text), path, new_text)
    _write_atomically(path, new_text)
    return load(current.path)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
