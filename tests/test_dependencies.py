"""A dependency that imports, then fails at run time, is one `error:` line naming it and its
version (zenedge/dependencies.py), in the CLI and through the daemon. Never a traceback, never
just "internal error"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO


def _distribution(site, name: str, version: str, module_source: str) -> None:
    """An installed distribution `name` in the folder `site`: its package and its metadata."""
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(module_source)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


PROBE = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])     # the decoy folder, first (as a clone's root under `python -m`)
    sys.path.insert(1, sys.argv[2])     # the installed distributions
    from zenedge.dependencies import from_dependency
    from zenedge.server.errors import response
    try:
        import usesdep
    except ImportError as exc:
        line = from_dependency(exc)
        answer = response(exc)
        print(json.dumps({"line": str(line), "exit": line.exit_code, "status": answer.status_code,
                          "body": json.loads(answer.body)}))
""")


def test_a_shadowed_dependency_is_one_line_naming_both_distributions(tmp_path):
    site, decoys = tmp_path / "site-packages", tmp_path / "clone"
    _distribution(site, "usesdep", "2.5.0", "from shadowdep import NEEDED\n")
    _distribution(site, "shadowdep", "0.19.1", "NEEDED = 1\n")
    (decoys / "shadowdep").mkdir(parents=True)
    (decoys / "shadowdep" / "__init__.py").write_text("OTHER = 1\n")
    done = subprocess.run([sys.executable, "-c", PROBE, str(decoys), str(site)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    import json

    result = json.loads(done.stdout)
    assert result["line"].startswith("usesdep 2.5.0 failed to import from shadowdep 0.19.1: cannot import name "
                                     "'NEEDED' from 'shadowdep'")
    assert f"{decoys / 'shadowdep' / '__init__.py'} is not the installed shadowdep: it shadows it" in result["line"]
    assert result["exit"] == 3 and result["status"] == 503
    assert result["body"]["error"]["message"].startswith("usesdep 2.5.0 failed to import")
    assert "constraints.txt" in result["body"]["error"]["hint"]


def test_a_missing_name_in_a_new_release_names_the_release(tmp_path):
    site = tmp_path / "site-packages"
    _distribution(site, "usesdep", "3.0.0", "from usesdep_gone import X\n")
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "nothing"), str(site)], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"line": "usesdep 3.0.0 failed to import: No module named \'usesdep_gone\'' in done.stdout


def test_an_error_of_zenedge_itself_is_not_blamed_on_a_dependency():
    from zenedge.dependencies import from_dependency

    assert from_dependency(ValueError("a bug")) is None
    try:
        import zenedge.no_such_module  # noqa: F401
    except ImportError as exc:
        assert from_dependency(exc) is None


def test_the_cli_says_one_line_when_transformers_meets_a_shadowed_kernels(tmp_path, tiny_base_dir):
    """The issue's own failure, end to end where this transformers imports PyPI's `kernels`: a
    command started (`python -m`) in a folder holding a decoy kernels/ package."""
    from importlib.util import find_spec

    if find_spec("kernels") is None:
        pytest.skip("PyPI's kernels is not installed: this transformers never imports it")
    from tests.server.harness import make_home

    home, config_path = make_home(tmp_path, tiny_base_dir)
    (tmp_path / "clone" / "kernels").mkdir(parents=True)
    (tmp_path / "clone" / "kernels" / "__init__.py").write_text("")
    env = {**os.environ, "ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "ZENEDGE_KEEP_ALIVE": "0"}
    done = subprocess.run([sys.executable, "-m", "zenedge.cli", "run", "p0", "hi", "--max-tokens", "2"],
                          cwd=tmp_path / "clone", env=env, capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        pytest.skip("this transformers imports nothing from kernels that the decoy lacks")
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: transformers ") and " from kernels " in done.stderr
    assert "it shadows it" in done.stderr
    assert str(REPO) not in done.stderr      # the decoy, not the repository, is named
