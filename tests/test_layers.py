"""Imports point one way (STYLE.md): config/errors → store, formats, math, kernels → registry,
runtime → pool → server → CLI. Checked on the source, lazy imports inside functions included."""

import ast

import pytest

from tests.conftest import REPO

# Lower number = lower layer. A module may import only from its own layer or below.
LAYERS = {
    "zenedge.errors": 0, "zenedge.names": 0, "zenedge.sizes": 0, "zenedge.paths": 0, "zenedge.config": 0,
    "zenedge.store": 1, "zenedge.adapters": 1, "zenedge.bitdelta": 1, "zenedge.merge": 1, "zenedge.kernels": 1,
    "zenedge.evaluation": 1, "zenedge.api": 1,
    "zenedge.bases": 2, "zenedge.runtime": 2, "zenedge.registry": 2,
    "zenedge.pool": 3, "zenedge.registry.pull": 4,
    "zenedge.server": 5, "zenedge.bench": 5,
    "zenedge.cli": 6, "zenedge.__main__": 6, "zenedge.bench.__main__": 6,  # entry points
}


def layer_of(module: str) -> int | None:
    if module == "zenedge":  # the package itself holds only the version
        return 0
    best = None
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return best[1] if best else None


def modules():
    for path in sorted((REPO / "zenedge").rglob("*.py")):
        name = "zenedge." + ".".join(path.relative_to(REPO / "zenedge").with_suffix("").parts)
        yield name.removesuffix(".__init__"), path
    for path in sorted((REPO / "kernels").glob("*.py")):
        yield "zenedge.kernels." + path.stem, path


def imports(path, package):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield ".".join(base + ([node.module] if node.module else []))
            elif node.module:
                yield node.module


@pytest.mark.parametrize("module,path", list(modules()), ids=lambda v: str(v).rsplit("/", 1)[-1])
def test_imports_point_down(module, path):
    own = layer_of(module)
    assert own is not None, f"{module} has no layer in tests/test_layers.py"
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for target in imports(path, package):
        layer = layer_of(target) if target.startswith("zenedge") else None
        assert layer is None or layer <= own, f"{module} (layer {own}) imports {target} (layer {layer})"


@pytest.mark.parametrize("package", ["zenedge.store", "zenedge.adapters.safetensors_file",
                                     "zenedge.adapters.peft_lora", "zenedge.registry.manifest",
                                     "zenedge.config", "zenedge.api"])
def test_torch_free_layers(package):
    root = REPO / "/".join(package.split("."))
    paths = list(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    for path in paths:
        heavy = {t.split(".")[0] for t in imports(path, package)} & {"torch", "transformers", "peft", "triton"}
        assert not heavy, f"{path.relative_to(REPO)} imports {heavy}"
