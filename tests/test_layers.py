"""Imports point one way (STYLE.md): config/errors → store, formats, math, kernels → registry,
runtime → pool → server → CLI, and no module imports itself back through others. Checked on the
source: lazy imports inside functions count, and so do modules named by string to
`importlib.import_module`."""

import ast
from functools import cache

import pytest

from tests.conftest import REPO

# Lower number = lower layer. A module may import only from its own layer or below.
LAYERS = {
    "zenedge.errors": 0, "zenedge.names": 0, "zenedge.sizes": 0, "zenedge.paths": 0, "zenedge.config": 0,
    "zenedge.files": 0, "zenedge.durations": 0, "zenedge.digests": 0, "zenedge.lazy_exports": 0,
    "zenedge.dependencies": 0,
    "zenedge.store": 1, "zenedge.adapters": 1, "zenedge.bitdelta": 1, "zenedge.merge": 1, "zenedge.kernels": 1,
    "zenedge.api": 1, "zenedge.gguf_file": 1,
    "zenedge.bases": 2, "zenedge.runtime": 2, "zenedge.registry": 2, "zenedge.evaluation": 2,
    "zenedge.pool": 3,
    "zenedge.server": 5, "zenedge.bench": 5,
    "zenedge.cli": 6, "zenedge.__main__": 6, "zenedge.bench.__main__": 6,  # entry points
}
# Calls whose first argument names a module that is then imported.
IMPORTING_CALLS = {"import_module", "__import__"}
# Cycles known and owned by another change, each to be deleted with the change that breaks it
# (the test fails if a listed cycle is gone, so this list cannot go stale).
KNOWN_CYCLES: list[set[str]] = []


def layer_of(module: str) -> int | None:
    if module == "zenedge":  # the package itself holds only the version
        return 0
    best = None
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return best[1] if best else None


@cache
def modules() -> dict:
    found = {}
    for path in sorted((REPO / "zenedge").rglob("*.py")):
        name = "zenedge." + ".".join(path.relative_to(REPO / "zenedge").with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    for path in sorted((REPO / "kernels").rglob("*.py")):
        name = "zenedge.kernels." + ".".join(path.relative_to(REPO / "kernels").with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports(path, package):
    """Every module the file imports. `from a import b` imports a.b when b is a module, else a."""
    known = modules()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                yield f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in IMPORTING_CALLS:
                yield node.args[0].value


def package_of(module: str, path) -> str:
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]


@cache
def graph() -> dict[str, set[str]]:
    """zenedge module → the zenedge modules it imports (anywhere in the file)."""
    known = modules()
    return {module: {t for t in imports(path, package_of(module, path)) if t in known and t != module}
            for module, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


@pytest.mark.parametrize("module", list(modules()), ids=lambda v: v.removeprefix("zenedge."))
def test_imports_point_down(module):
    path = modules()[module]
    own = layer_of(module)
    assert own is not None, f"{module} has no layer in tests/test_layers.py"
    for target in imports(path, package_of(module, path)):
        layer = layer_of(target) if target.startswith("zenedge") else None
        assert layer is None or layer <= own, f"{module} (layer {own}) imports {target} (layer {layer})"


def test_the_package_imports_nothing_from_tools():
    """tools/ (the repository's GPU tooling and one-off timings) is not installed: the package
    must run without it."""
    for module, path in modules().items():
        found = [t for t in imports(path, package_of(module, path)) if t == "tools" or t.startswith("tools.")]
        assert found == [], f"{module} imports {found}"


def test_no_module_imports_itself_back():
    found = cycles(graph())
    unexpected = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert unexpected == [], f"import cycles: {unexpected}"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert gone == [], f"these cycles are gone: delete them from KNOWN_CYCLES: {gone}"


def test_the_cycle_check_sees_lazy_and_string_imports(tmp_path):
    """The checker itself: a cycle closed by a lazy import or `importlib.import_module(...)` is
    found; an import from a package's submodule is an edge to that submodule."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [{"a", "b", "c"}]
    named = tmp_path / "named.py"
    named.write_text("import importlib\n\ndef f():\n    return importlib.import_module('zenedge.pool.maintain')\n")
    assert "zenedge.pool.maintain" in set(imports(named, "zenedge"))
    background = graph()["zenedge.server.background"]
    assert "zenedge.pool.maintain" in background  # lazy, inside a method
    assert "zenedge.pool.budget" in graph()["zenedge.server.native_routes"]  # from zenedge.pool.budget import ...
    assert "zenedge.pool" in graph()["zenedge.cli.backend"]  # lazy, inside a method


@pytest.mark.parametrize("package", ["zenedge.store", "zenedge.adapters.safetensors_file",
                                     "zenedge.adapters.peft_lora", "zenedge.registry.manifest",
                                     "zenedge.config", "zenedge.api"])
def test_torch_free_layers(package):
    root = REPO / "/".join(package.split("."))
    paths = list(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    for path in paths:
        heavy = {t.split(".")[0] for t in imports(path, package)} & {"torch", "transformers", "peft", "triton"}
        assert not heavy, f"{path.relative_to(REPO)} imports {heavy}"


def test_the_pool_package_imports_without_torch():
    """`import zenedge.pool` is what pull, search and budget commands pay: the merger and the gate
    (torch) load only when a merge is tried."""
    import subprocess
    import sys

    code = "import sys, zenedge.pool; print(' '.join(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == ""
