"""The TypeScript client's own tests (`node --test`), run here against a live daemon so that the
README's single test command covers them. The toolchain is tiny and pinned (typescript and
@types/node in desktop/package-lock.json); `npm ci` runs only when it is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO

DESKTOP = REPO / "desktop"


def run(command: list[str], *, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=DESKTOP, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def toolchain_ready() -> bool:
    pinned = json.loads((DESKTOP / "package-lock.json").read_text())["packages"]
    for name in ("typescript", "@types/node"):
        installed = DESKTOP / "node_modules" / name / "package.json"
        if not installed.is_file() or \
                json.loads(installed.read_text())["version"] != pinned[f"node_modules/{name}"]["version"]:
            return False
    return True


@pytest.fixture(scope="module")
def compiled():
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the TypeScript client cannot be tested here")
    if not toolchain_ready():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed: cannot install the pinned TypeScript compiler")
        installed = run(["npm", "ci", "--no-audit", "--no-fund"])
        assert installed.returncode == 0, installed.stdout + installed.stderr
    shutil.rmtree(DESKTOP / "dist", ignore_errors=True)
    built = run(["node", "node_modules/typescript/bin/tsc", "-p", "."])
    assert built.returncode == 0, built.stdout + built.stderr  # type errors included: the client fits wire.ts


def test_typescript_client_against_a_live_daemon(compiled, daemon):
    result = run(["node", "--test", "--test-reporter=spec", "dist/test/"],
                 env={"ZENEDGE_HOME": str(daemon.home), "ZENEDGE_TOKEN": daemon.token})
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "# fail 0" in result.stdout or "fail 0" in result.stdout
