"""What a registry publisher measures once so that every pull does not: each profile's anchors
(its eval set's base and own answer losses per example, read as the quality gate reads them),
written to the profile folder's anchors.json for `registry build` to embed in the manifest.

A pull that has to merge then needs only the merged adapter's rows, and re-measures a couple of
examples of the claims (pool/gate.py) instead of 32 to 128 rows of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from zenedge.adapters.lora_tensors import read_lora_factors
from zenedge.adapters.peft_lora import read_lora_dir
from zenedge.bases import ensure_base
from zenedge.config import Config
from zenedge.pool.gate import QualityGate
from zenedge.registry.builder import build_manifest, find_lora, profile_folders, write_anchors
from zenedge.runtime.variants import lora_variant
from zenedge.store import Store


def measure_registry_anchors(store: Store, cfg: Config, root: Path,
                             progress: Callable[[str], None] | None = None) -> list[str]:
    """Write anchors.json into every LoRA profile folder of `root` that has an eval set and whose
    anchors are missing or stale; returns the names measured."""
    from zenedge.runtime.engine import Engine

    say = progress or (lambda message: None)
    measured, engine = [], None
    for folder in profile_folders(Path(root)):
        manifest = build_manifest(folder)
        if manifest.kind != "lora" or manifest.eval is None:
            say(f"{manifest.name}: skipped ({'no eval set' if manifest.eval is None else 'a BitDelta'})")
            continue
        if manifest.eval_anchors is not None:
            say(f"{manifest.name}: anchors up to date")
            continue
        base = ensure_base(store, manifest.base_name)
        engine = engine or Engine(store, cfg, scoring_only=True)
        gate = QualityGate(engine.resident(base["name"]))  # the engine keeps one resident per base
        lora = read_lora_dir(find_lora(folder)[0].parent, {m: tuple(s) for m, s in base["modules"].items()})
        factors = read_lora_factors(lora.weights, lora.config, dtype=torch.float32)
        own = lora_variant(f"publish-{manifest.name}", factors, gate.resident)
        eval_path = folder / manifest.eval.path
        say(f"{manifest.name}: measuring base and own losses on {eval_path.name}")
        anchors = gate.measure_anchors(manifest.name, eval_path, own)
        write_anchors(folder, anchors, manifest.eval.sha256, manifest.base_sha256)
        measured.append(manifest.name)
    return measured
