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

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"}
MAX_CONFIG_BYTES = 1 << 20

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
    if not path.is_file():
        raise InvalidAdapter(f"{directory}: no {CONFIG_NAME} (expected a PEFT LoRA directory from save_pretrained)")
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
    if not weights.is_file():
        raise InvalidAdapter(f"{directory}: no {WEIGHTS_NAME}")
    header = read_header(weights)
    modules = _modules(header, config)
    if base_modules is not None:
        _check_against_base(weights, modules, base_modules)
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
