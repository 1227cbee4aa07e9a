"""The package is what pyproject.toml says it is, and the CLI starts without the heavy stack."""

import os
import subprocess
import sys
import tomllib

from tests.conftest import REPO


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"zenedge"} | {
        "zenedge." + ".".join(p.parent.relative_to(REPO / "zenedge").parts)
        for p in (REPO / "zenedge").rglob("__init__.py") if p.parent != REPO / "zenedge"
    } | {"zenedge.profiles"} | {  # mapped from top-level folders (pyproject's package-dir)
        "zenedge.kernels." + ".".join(p.parent.relative_to(REPO / "kernels").parts)
        for p in (REPO / "kernels").rglob("__init__.py")
    }
    assert found == listed, f"pyproject packages out of date: missing {found - listed}, extra {listed - found}"


# The only name the tree makes importable from its root: zenedge itself. Every other top-level
# folder, tests/ included (pytest imports it as a namespace package: pyproject's pytest options),
# is a plain folder or a namespace portion, which any installed package of the same name outranks.
TOP_LEVEL_PACKAGES = {"zenedge"}


def _importable_from_the_root() -> set[str]:
    """Top-level names that a Python started in the repository root imports from the tree: regular
    packages (a folder with __init__.py) and modules."""
    return {entry.stem for entry in REPO.iterdir() if entry.stem.isidentifier() and (
        (entry.is_dir() and (entry / "__init__.py").exists()) or entry.suffix == ".py")}


def test_no_top_level_folder_is_a_package_but_zenedge():
    """Regression: kernels/__init__.py made the repository's kernels/ the top-level `kernels` for
    anything started in the root (`python -m zenedge.cli serve`, pytest), and transformers 5.25's
    `from kernels import CUDAProperties` (PyPI's `kernels`) failed on it: every first `pull` did."""
    assert _importable_from_the_root() == TOP_LEVEL_PACKAGES


def test_no_installed_distribution_provides_a_name_the_tree_holds():
    from importlib.metadata import packages_distributions

    provided = packages_distributions()
    clashes = {name: provided[name] for name in _importable_from_the_root()
               if set(provided.get(name, ())) - {"zenedge"}}
    assert clashes == {}, f"installed distributions that the tree would shadow from its root: {clashes}"


def test_an_installed_package_outranks_every_top_level_folder(tmp_path):
    """A decoy distribution named after each top-level folder: from the root (the current directory
    first on sys.path, as `python -m` and `python -c` put it), `import NAME` must load the decoy."""
    folders = sorted(entry.name for entry in REPO.iterdir()
                     if entry.is_dir() and entry.name.isidentifier() and entry.name not in TOP_LEVEL_PACKAGES)
    assert {"kernels", "tests", "profiles", "tools", "desktop"} <= set(folders)
    site = tmp_path / "site-packages"
    for name in folders:
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text("DECOY = True\n")
    code = ("import importlib, sys\n"
            "print(' '.join(n for n in sys.argv[1:] if not getattr(importlib.import_module(n), 'DECOY', False)))")
    done = subprocess.run([sys.executable, "-c", code, *folders], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"shadowed from the repository root: {done.stdout.strip()}"


def test_a_wheel_installs_the_kernels_and_the_registry_inside_zenedge(tmp_path):
    """A regular (non-editable) install: kernels/native, kernels/bitdelta and profiles/ land under
    zenedge/, and the wheel has no top-level package but zenedge."""
    import shutil
    import zipfile

    tree = tmp_path / "tree"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                              "__pycache__", ".pytest_cache", ".hypothesis"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(tree)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("zenedge-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == {"zenedge"}
    for expected in ("zenedge/kernels/__init__.py", "zenedge/kernels/native/__init__.py",
                     "zenedge/kernels/native/decode_step.c", "zenedge/kernels/bitdelta/triton.py",
                     "zenedge/profiles/index.json", "zenedge/profiles/writer/manifest.json"):
        assert expected in names, expected
    assert not any(name.startswith("zenedge/profiles/recipes/") for name in names)


def test_cli_import_does_not_load_the_heavy_stack():
    code = ("import sys, zenedge.cli; "
            "print(' '.join(m for m in ('torch', 'transformers', 'triton', 'peft', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_list_does_not_load_the_heavy_stack():
    code = ("import sys\nfrom zenedge.cli import main\nmain(['list', '--json'])\n"
            "print('LOADED', ' '.join(m for m in ('torch', 'transformers', 'triton', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("LOADED")


def test_the_c_kernels_sources_ship_with_the_package():
    """zenedge.kernels.native compiles its C sources on first use: a wheel without them would fall back
    to torch's kernels on every machine, silently."""
    from fnmatch import fnmatch

    from zenedge.kernels import native

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["zenedge.kernels.native"]
    for source in native.SOURCES + native.HEADERS:
        assert source.exists() and any(fnmatch(source.name, pattern) for pattern in patterns), source.name


def test_the_profile_recipes_do_not_ship():
    """profiles/recipes/ trains and evaluates the embedded profiles: tools for this repository, not
    installed code (zenedge.profiles ships the registry's data only)."""
    from fnmatch import fnmatch

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert not any(package.startswith("zenedge.profiles.") for package in setuptools["packages"])
    recipes = [p.relative_to(REPO / "profiles").as_posix() for p in (REPO / "profiles" / "recipes").iterdir()]
    shipped = [r for r in recipes for pattern in setuptools["package-data"]["zenedge.profiles"] if fnmatch(r, pattern)]
    assert recipes and shipped == []


# Imported name → the distribution that provides it, where they differ.
DISTRIBUTION = {"sqlite_utils": "sqlite-utils"}


def imported_distributions() -> set[str]:
    import ast

    names = set()
    for path in [*(REPO / "zenedge").rglob("*.py"), *(REPO / "kernels").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    third_party = names - set(sys.stdlib_module_names) - {"zenedge"}
    return {DISTRIBUTION.get(name, name) for name in third_party}


def test_the_declared_dependencies_are_the_imported_ones():
    """Regression: click (the CLI) was used but not declared, and typer was declared but never used.
    A feature's own extra (not the tests') may declare what only that feature imports."""
    import re

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(specs):
        return {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower() for spec in specs}
    declared = names(project["dependencies"])
    features = names(spec for extra, specs in project["optional-dependencies"].items() if extra != "test"
                     for spec in specs)
    imported = imported_distributions()
    assert imported - declared - features == set(), f"imported but not declared: {imported - declared - features}"
    assert declared - imported == set(), f"declared but never imported: {declared - imported}"


def _installed_on(platform: str, machine: str) -> set[str]:
    """The distributions `pip install zenedge` asks for on a platform, by the dependencies' markers."""
    from packaging.requirements import Requirement

    environment = {"sys_platform": platform, "platform_system": {"linux": "Linux", "darwin": "Darwin"}[platform],
                   "platform_machine": machine, "python_version": "3.11", "implementation_name": "cpython"}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(spec) for spec in project["dependencies"]]
    return {r.name for r in requirements if r.marker is None or r.marker.evaluate(environment)}


def test_macos_installs_without_triton_and_linux_with_it():
    """triton has no macOS wheels: a laptop's `pip install` must not ask for it. On Linux, where CUDA
    can be, it stays part of the stack, as do peft and torch everywhere."""
    mac, linux = _installed_on("darwin", "arm64"), _installed_on("linux", "x86_64")
    assert "triton" not in mac and "triton" in linux
    assert {"torch", "peft", "safetensors", "platformdirs", "sqlite-utils", "psutil"} <= mac & linux
    assert linux - mac == {"triton"}


def test_zenedge_imports_and_runs_its_cli_without_triton():
    """What macOS installs is enough to start: nothing imports triton on the way to a command."""
    code = ("import sys; sys.modules['triton'] = None\n"
            "from zenedge.cli import main\n"
            "main(['--help'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout


def test_the_license_file_is_the_one_pyproject_names():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert "Apache License" in (REPO / "LICENSE").read_text() and "Version 2.0" in (REPO / "LICENSE").read_text()


def test_requires_python_allows_only_versions_with_tomllib():
    """zenedge/config.py reads TOML with the standard library's tomllib, new in Python 3.11."""
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"
