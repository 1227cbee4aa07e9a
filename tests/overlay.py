"""The overlay of agent libraries whose pins clash with the test extra's (instructor caps jiter <
0.15, litellm and llama-index cap openai < 3, while langchain-openai needs openai >= 3): installed
apart with `pip install --target .overlay`, pinned by tests/overlay-constraints.txt, once per
checkout (~1 minute), and driven in a subprocess with the overlay first on its path
(tests/overlay_clients.py). Used by tests/server/test_overlay_libraries.py and
`python -m tests.agent_libraries`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OVERLAY = REPO / ".overlay"
PINS = (REPO / "tests" / "overlay-requirements.txt", REPO / "tests" / "overlay-constraints.txt")


class OverlayUnavailable(Exception):
    """pip could not install the overlay (no package index, most likely)."""


def install() -> Path:
    """The overlay's path, installed first if it is missing or its pins changed."""
    wanted = hashlib.sha256(b"".join(pin.read_bytes() for pin in PINS)).hexdigest()
    stamp = OVERLAY / ".pins-sha256"
    if stamp.is_file() and stamp.read_text() == wanted:
        return OVERLAY
    staging = OVERLAY.with_name(".overlay.partial")
    shutil.rmtree(staging, ignore_errors=True)
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(staging),
         "-r", str(PINS[0]), "-c", str(PINS[1])], capture_output=True, text=True, timeout=1200)
    if installed.returncode != 0:
        raise OverlayUnavailable((installed.stderr.strip().splitlines() or ["no output"])[-1])
    (staging / ".pins-sha256").write_text(wanted)
    shutil.rmtree(OVERLAY, ignore_errors=True)
    staging.rename(OVERLAY)   # whole or not at all: a stopped install leaves only the staging folder
    return OVERLAY


def run_clients(urls: dict, seeds: int, case: str = "") -> list[dict]:
    """Each overlay case over `seeds` seeded tries: [{"case", "valid", "tries", "failures", "seconds"}]."""
    env = {**os.environ, "PYTHONPATH": str(install()), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    ran = subprocess.run(
        [sys.executable, str(REPO / "tests" / "overlay_clients.py"), "--v1", urls["v1"], "--api", urls["api"],
         "--token", urls["token"], "--seeds", str(seeds), "--case", case],
        env=env, capture_output=True, text=True, timeout=3600)
    if ran.returncode != 0:
        raise RuntimeError(f"tests/overlay_clients.py failed: {ran.stderr[-2000:]}")
    return [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
