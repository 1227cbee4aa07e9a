"""Reading and validating PEFT LoRA directories (what `save_pretrained` writes), torch-free.

Validation is against the base's linear modules ({module: (out, in)}, taken from the base's
safetensors header when the base was registered), so an adapter for another model is refused
before anything is stored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from zenedge.adapters.safetensors_file import SafetensorsHeader, check_finite, read_header
from zenedge.errors import InvalidAdapter
from zenedge.files import regular_file

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"}
MAX_CONFIG_BYTES = 1 << 20
ALL_LINEAR = "all-linear"  # PEFT's shorthand for every linear layer

# PEFT names weights "base_model.model.<module>.lora_A[.<adapter>].weight".
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")
# Options whose semantics we do not implement: refuse rather than silently serve something else.
_UNSUPPORTED = {
    "use_dora": "DoRA adapters",
    "modules_to_save": "adapters that also replace whole modules (modules_to_save)",
    "layer_replication": "layer replication",
}


@dataclass(frozen=True)
class LoraAdapter:
    """A validated PEFT LoRA directory."""

    config: dict           # adapter_config.json as written by PEFT
    weights: Path          # adapter_model.safetensors
    rank: int              # the largest rank over modules (rank_pattern may vary it)
    alpha: float
    target_modules: list[str]   # module names as they appear in the base, sorted
    modules: dict[str, tuple[int, int, int]]  # module → (rank, in, out)


def _load_config(directory: Path) -> dict:
    path = directory / CONFIG_NAME
    if not path.exists():
        raise InvalidAdapter(f"{directory}: no {CONFIG_NAME} (expected a PEFT LoRA directory from save_pretrained)")
    regular_file(path, "adapter config")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise InvalidAdapter(f"{path}: implausibly large ({path.stat().st_size} bytes)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidAdapter(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise InvalidAdapter(f"{path}: must be a JSON object")
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise InvalidAdapter(f"{path}: peft_type is {config.get('peft_type')!r}; only LORA adapters are supported")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise InvalidAdapter(f"{path}: {what} are not supported ({key} is set)")
    r = config.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 4096:
        raise InvalidAdapter(f"{path}: r must be an integer in 1..4096, got {r!r}")
    alpha = config.get("lora_alpha", r)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1e6:
        raise InvalidAdapter(f"{path}: lora_alpha must be a positive number, got {alpha!r}")
    return config


def read_lora_dir(directory: Path, base_modules: dict[str, tuple[int, int]] | None = None,
                  check_values: bool = True) -> LoraAdapter:
    """Validate `directory` as a PEFT LoRA adapter (optionally against the base's modules)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InvalidAdapter(f"{directory}: not a directory (expected a PEFT LoRA directory)")
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise InvalidAdapter(
            f"{directory}: refusing pickle files ({', '.join(pickles)}); "
            "only safetensors are loaded (re-save with save_pretrained(safe_serialization=True))"
        )
    config = _load_config(directory)
    weights = directory / WEIGHTS_NAME
    if not weights.exists():
        raise InvalidAdapter(f"{directory}: no {WEIGHTS_NAME}")
    regular_file(weights, "adapter weights")   # a FIFO would block the read; say what it is instead
    header = read_header(weights)
    modules = _modules(header, config)
    if base_modules is not None:
        _check_against_base(weights, modules, base_modules)
    _check_targets(directory / CONFIG_NAME, config, modules, base_modules)
    if check_values:
        check_finite(header)
    return LoraAdapter(
        config=config,
        weights=weights,
        rank=max(r for r, _, _ in modules.values()),
        alpha=float(config.get("lora_alpha", config["r"])),
        target_modules=sorted(modules),
        modules=modules,
    )


def _modules(header: SafetensorsHeader, config: dict) -> dict[str, tuple[int, int, int]]:
    name = header.path.name
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, info in header.tensors.items():
        match = _KEY.match(key)
        if not match:
            raise InvalidAdapter(f"{name}: unexpected tensor {key!r} (not a LoRA A/B weight)")
        if info.dtype not in {"F32", "F16", "BF16"}:
            raise InvalidAdapter(f"{name}: tensor {key!r} has dtype {info.dtype}; expected a float type")
        if len(info.shape) != 2:
            raise InvalidAdapter(f"{name}: tensor {key!r} has shape {list(info.shape)}; expected 2-D")
        shapes.setdefault(match["module"], {})[match["which"]] = info.shape
    if not shapes:
        raise InvalidAdapter(f"{name}: holds no LoRA weights")
    rank_pattern = config.get("rank_pattern") or {}
    modules = {}
    for module, pair in sorted(shapes.items()):
        if set(pair) != {"A", "B"}:
            raise InvalidAdapter(f"{name}: module {module!r} lacks lora_{'B' if 'A' in pair else 'A'}")
        (r_a, fan_in), (fan_out, r_b) = pair["A"], pair["B"]
        expected_r = next((r for pattern, r in rank_pattern.items() if module.endswith(pattern)), config["r"])
        if r_a != r_b or r_a != expected_r:
            raise InvalidAdapter(
                f"{name}: module {module!r} has lora_A {list(pair['A'])} and lora_B {list(pair['B'])}; "
                f"expected rank {expected_r}"
            )
        modules[module] = (r_a, fan_in, fan_out)
    return modules


def _check_against_base(weights: Path, modules: dict[str, tuple[int, int, int]],
                        base_modules: dict[str, tuple[int, int]]) -> None:
    for module, (_, fan_in, fan_out) in modules.items():
        shape = base_modules.get(module)
        if shape is None:
            raise InvalidAdapter(
                f"{weights.name}: module {module!r} does not exist in the base; the adapter was made for another model"
            )
        if tuple(shape) != (fan_out, fan_in):
            raise InvalidAdapter(
                f"{weights.name}: module {module!r} is {fan_out}×{fan_in} in the adapter but "
                f"{shape[0]}×{shape[1]} in the base; the adapter was made for another model"
            )


def _selects(targets: str | list[str], module: str) -> bool:
    """PEFT's rule for target_modules (and exclude_modules): a string is a regular expression that
    must match the whole module name; a list entry matches the module of that name or any module
    whose name ends with "." + it."""
    if isinstance(targets, str):
        return re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith(f".{t}") for t in targets)


def _module_pattern(path: Path, config: dict, key: str) -> str | list[str] | None:
    """target_modules / exclude_modules as PEFT reads them: a list of names or one regular expression."""
    value = config.get(key)
    if value is None or value == []:
        return None
    if not (isinstance(value, str) or isinstance(value, list) and all(isinstance(t, str) for t in value)):
        raise InvalidAdapter(f"{path}: {key} must be a list of module names or a regular expression")
    if isinstance(value, str):
        if value.lower() == ALL_LINEAR:
            return ".*"  # every linear layer (PEFT leaves out the output layer, which we refuse anyway)
        try:
            re.compile(value)
        except re.error as exc:
            raise InvalidAdapter(f"{path}: {key} {value[:80]!r} is not a valid regular expression ({exc})") from None
    return value


def _check_targets(path: Path, config: dict, modules: dict[str, tuple[int, int, int]],
                   base_modules: dict[str, tuple[int, int]] | None) -> None:
    """target_modules is what PEFT (and every engine that loads our export) uses to place the
    weights: each target must name a linear of the base, and every module with weights must be
    targeted, or the export loads differently from what zenedge serves, or not at all."""
    targets = _module_pattern(path, config, "target_modules")
    if targets is None:
        raise InvalidAdapter(f"{path}: no target_modules (PEFT needs them to place the weights)")
    excluded = _module_pattern(path, config, "exclude_modules")
    if base_modules is not None:
        if isinstance(targets, str):
            unmatched = [] if any(_selects(targets, m) for m in base_modules) else [targets]
        else:
            unmatched = [t for t in targets if not any(_selects([t], m) for m in base_modules)]
        if unmatched:
            raise InvalidAdapter(f"{path}: target_modules {', '.join(repr(t[:80]) for t in unmatched[:5])} match no "
                                 "module of the base; the adapter was made for another model")
    untargeted = sorted(m for m in modules if not _selects(targets, m) or (excluded and _selects(excluded, m)))
    if untargeted:
        more = f" (and {len(untargeted) - 1} more)" if len(untargeted) > 1 else ""
        raise InvalidAdapter(f"{path}: holds weights for {untargeted[0]!r}{more} that target_modules does not "
                             "select; PEFT would drop them")
