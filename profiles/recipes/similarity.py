"""K-Merge similarity between every pair of LoRA profiles, into profiles/quality.json.

    python -m profiles.recipes.similarity

Uses the pool's own measure (zenedge.merge.similarity.lora_cosine: mean over modules of the
cosine of ΔW = B·A). It shows whether the deliberately similar pairs (arith/wordmath,
jsonx/csvx, writer/manpage) look similar to the merge policy. Cheap: no model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from zenedge.adapters.lora_tensors import read_lora_factors
from zenedge.merge.similarity import lora_cosine

PROFILES = Path(__file__).resolve().parent.parent
RESULTS = PROFILES / "quality.json"


def lora_profiles() -> dict[str, dict]:
    """name -> {module: LoraFactors} for every profile with an adapter."""
    adapters = {}
    for config_path in sorted(PROFILES.glob("*/adapter/adapter_config.json")):
        config = json.loads(config_path.read_text())
        adapters[config_path.parent.parent.name] = read_lora_factors(
            config_path.parent / "adapter_model.safetensors", config)
    return adapters


def main() -> None:
    adapters = lora_profiles()
    names = sorted(adapters)
    matrix = {a: {b: round(lora_cosine(adapters[a], adapters[b]), 4) for b in names} for a in names}
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["_similarity"] = matrix
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    for a in names:
        print(a.ljust(10), " ".join(f"{matrix[a][b]:+.3f}" for b in names))


if __name__ == "__main__":
    main()
