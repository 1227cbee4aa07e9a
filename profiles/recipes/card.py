"""Write a profile's recipe.json: what `zenedge search` shows plus how the profile was made.

`zenedge registry build` (not here) turns recipe.json + files into the manifest; this card is
the human- and machine-readable record of data, hyper-parameters and measured training numbers.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from profiles.recipes.data import Task

BASE_NAME = "smollm2-135m"
BASE_SHA256 = "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"
VERSION = "1.0.0"


def write_recipe(profile_dir: Path, task: Task, kind: str, recipe: dict) -> Path:
    """recipe: data + hyper-parameters + measured numbers (free-form, JSON-serialisable)."""
    card = {
        "name": task.name,
        "version": VERSION,
        "description": task.description,
        "kind": kind,
        "base": {"name": BASE_NAME, "sha256": BASE_SHA256},
        "license": task.license,
        "metric": task.metric,
        "eval_set": "eval.jsonl",
        "recipe": {"source": task.source, **recipe, "date": dt.date.today().isoformat()},
    }
    path = Path(profile_dir) / "recipe.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    return path
