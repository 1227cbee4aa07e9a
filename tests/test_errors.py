"""The one error table (zenedge.errors.ERRORS): every error code zenedge raises, with its class,
exit code and HTTP status; the CLI, the daemon and the daemon's client all map through it."""

import importlib
import subprocess
import sys

import pytest

from zenedge import errors
from zenedge.errors import ERRORS, ZenedgeError

# Every module that declares ZenedgeError subclasses (the table names them; this list lets the
# test load them all and find any class the table does not name).
DECLARING = ["zenedge.errors", "zenedge.server.errors", "zenedge.merge.errors", "zenedge.bitdelta.errors",
             "zenedge.evaluation"]


def declared_classes() -> list[type[ZenedgeError]]:
    for module in DECLARING:
        importlib.import_module(module)
    found, pending = [], [ZenedgeError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return [cls for cls in dict.fromkeys(found) if cls.__module__.startswith("zenedge")]


def test_queue_full_from_the_daemon_exits_3_in_a_cli_process():
    """Regression: the client found error classes by walking ZenedgeError.__subclasses__(), and a CLI
    process never imports zenedge.server, so the daemon's queue_full came back as a plain error with
    exit code 1 instead of 3 (try again later)."""
    code = ("import sys; from zenedge.api.client import error_from_wire; "
            "e = error_from_wire(503, {'error': {'code': 'queue_full', 'message': 'busy'}}); "
            "print(e.exit_code, e.code, 'zenedge.server' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3", "queue_full", "False"]


def test_every_error_class_is_in_the_table_with_its_exit_code_and_status():
    for cls in declared_classes():
        kind = ERRORS.get(cls.code)
        assert kind is not None, f"{cls.__module__}.{cls.__qualname__} has code {cls.code!r}, not in zenedge.errors.ERRORS"
        assert (cls.exit_code, cls.http_status) == (kind.exit_code, kind.http_status), cls
        if "code" in vars(cls):  # the class that introduces a code is the one the table names
            assert kind.where == f"{cls.__module__}.{cls.__qualname__}", (cls, kind.where)


def test_every_row_names_a_class_of_its_family():
    declared_classes()
    for code, kind in ERRORS.items():
        module, name = kind.where.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        assert cls.code == code
        if kind.family is not None:
            family = ERRORS[kind.family]
            assert issubclass(cls, errors.error_class(family.code)), (code, kind.family)


def test_a_code_whose_class_is_not_loaded_keeps_its_family_exit_code_and_status():
    in_process = errors.from_wire("queue_full", "busy", None)
    assert in_process.exit_code == 3 and in_process.http_status == 503 and isinstance(in_process, errors.Unavailable)
    unknown = errors.from_wire("no_such_code", "odd", "h")
    assert type(unknown) is ZenedgeError and unknown.exit_code == 1 and str(unknown) == "odd (h)"


def test_a_class_with_a_code_outside_the_table_is_refused_where_it_is_declared():
    with pytest.raises(TypeError, match="not in zenedge.errors.ERRORS"):
        type("Stray", (errors.InvalidInput,), {"code": "stray_code"})


def test_faults_of_the_machine_become_one_line_errors_with_their_own_codes():
    import errno
    import sqlite3

    from zenedge.errors import from_environment

    full = from_environment(OSError(errno.ENOSPC, "No space left on device", "/home/u/pool/blobs/x"))
    assert (full.code, full.exit_code, full.http_status) == ("storage_full", 74, 507)
    assert full.message == "no space left on the disk: /home/u/pool/blobs/x"
    denied = from_environment(OSError(errno.EROFS, "Read-only file system", "/ro/home/lock"))
    assert (denied.code, denied.exit_code) == ("permission_denied", 77)
    assert denied.message == "read-only file system: /ro/home/lock"
    assert from_environment(OSError(errno.EIO, "Input/output error")).code == "storage_error"
    assert from_environment(sqlite3.DatabaseError("file is not a database")).code == "store_corrupt"
    assert from_environment(sqlite3.OperationalError("attempt to write a readonly database")).code == "permission_denied"
    assert from_environment(sqlite3.OperationalError("database or disk is full")).code == "storage_full"
    assert from_environment(sqlite3.OperationalError("database is locked")).code == "store_busy"
    assert from_environment(ValueError("a bug")) is None            # a bug keeps its traceback
    assert from_environment(OSError("no errno")) is None


def test_a_write_failed_inside_a_rust_library_is_the_disk_fault_it_wraps(tmp_path):
    """Regression: the first `zenedge pull` converts the default base, and on a full disk
    safetensors' `save_file` (Rust) raised its own SafetensorError ("... No space left on device
    (os error 28)"): a traceback in-process, "internal error" through the daemon, instead of the
    README's exit 74. A file size limit makes the kernel refuse the same real write (EFBIG, as a
    quota does) without needing a mount; the child process ignores SIGXFSZ so the write fails
    instead of killing it."""
    code = f"""
import resource, signal
import numpy as np
from safetensors.numpy import save_file
from zenedge.errors import from_environment
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    save_file({{"w": np.zeros(1 << 16, dtype=np.float32)}}, {str(tmp_path / "w.safetensors")!r})
except Exception as exc:
    fault = from_environment(exc)
    print(type(exc).__name__, isinstance(exc, OSError), fault.code, fault.exit_code, fault.http_status)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["SafetensorError", "False", "storage_full", "74", "507"]
    assert from_environment_of("Error while serializing: I/O error: Input/output error (os error 5)") == "storage_error"
    assert from_environment_of("a bug mentioning no OS error") is None


def from_environment_of(text: str) -> str | None:
    fault = errors.from_environment(RuntimeError(text))
    return fault.code if fault else None
