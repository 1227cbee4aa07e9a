"""A dependency that installs and imports, then breaks at run time, as one line that names it.

A new release of a dependency (or a folder that shadows one) fails inside a lazy import, deep in a
command: transformers 5.25 imported PyPI's `kernels`, and a clone's own kernels/ stood in for it.
Without this the CLI showed a traceback and the daemon answered "internal error". The CLI's entry
point and the daemon's error handler both ask here, after errors.from_environment.
"""

from __future__ import annotations

import sys
from pathlib import Path

from zenedge.errors import Unavailable

HINT = ("zenedge was tested with the versions in constraints.txt; `zenedge doctor` names the ones in use "
        "and those outside it")


class BrokenDependency(Unavailable):
    """A third-party package failed to import something: exit 3, as a missing capability."""


def from_dependency(exc: BaseException) -> BrokenDependency | None:
    """The ImportError `exc` as one line naming the distributions involved and their versions; None
    when it is not an import failure, or names no installed distribution."""
    if not isinstance(exc, ImportError):
        return None
    importer = _innermost_third_party_frame(exc)
    imported = _distribution(exc.name) if exc.name else None
    if importer is None and imported is None:
        return None
    where = ""
    if imported is not None and exc.path and _shadowed(Path(exc.path), exc.name, imported):
        where = f"; {exc.path} is not the installed {imported.metadata['Name']}: it shadows it"
    text = " ".join(str(exc).split())
    if importer is not None and (imported is None or importer.metadata["Name"] != imported.metadata["Name"]):
        who = f"{_named(importer)} failed to import" + (f" from {_named(imported)}" if imported else "")
    else:
        who = f"{_named(imported or importer)} failed to import"
    return BrokenDependency(f"{who}: {text}{where}", hint=HINT)


def _named(dist) -> str:
    return f"{dist.metadata['Name']} {dist.version}"


def _innermost_third_party_frame(exc: BaseException):
    """The distribution of the innermost frame in `exc`'s traceback that runs a third-party module
    (not zenedge, not the standard library, not importlib's frozen frames): the importer."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        dist = _distribution(tb.tb_frame.f_globals.get("__name__", ""))
        if dist is not None:
            found = dist
        tb = tb.tb_next
    return found


def _distribution(module: str):
    """The installed distribution that provides top-level module `module`'s package, or None (zenedge
    itself, the standard library, a module no distribution declares)."""
    from importlib.metadata import PackageNotFoundError, distribution, packages_distributions

    top = module.split(".")[0]
    if not top or top == "zenedge" or top in sys.stdlib_module_names or top.startswith("_"):
        return None
    names = packages_distributions().get(top, [])
    for name in names:
        try:
            return distribution(name)
        except PackageNotFoundError:
            continue
    return None


def _shadowed(path: Path, module: str, dist) -> bool:
    """Whether the module loaded from `path` is not the one `dist` installs: `dist` ships the module
    among its own files (not an editable install), in a folder `path` is not in."""
    top = module.split(".")[0]
    ships = any(f.parts and f.parts[0] in (top, f"{top}.py") for f in dist.files or ())
    try:
        return ships and not path.resolve().is_relative_to(Path(dist.locate_file("")).resolve())
    except (OSError, ValueError):
        return False
