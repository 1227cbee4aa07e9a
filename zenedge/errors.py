"""The typed error hierarchy, and the one table that maps every error code to its class, exit code
and HTTP status.

Every error message is one line a user can act on. Layers raise these; the CLI turns them into
`error: <message>` + exit code, the server into `{"error": {"code", "message"}}` + status, and the
daemon's client turns that body back into the same error (`from_wire`), so a command fails with
the same message and exit code whether it ran locally or through the daemon.

`ERRORS` is the table: one row per code, including the codes of error families declared in other
layers (the daemon's, the merge math's, bitdelta's, eval sets'). A class takes its exit code and
HTTP status from its row when it is declared, and a class whose code has no row is refused then.
A code's `family` is the code it specialises: a process that never loaded the class (the CLI does
not import the server) still maps the code to the family's class with the row's exit code.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorKind:
    code: str               # stable, machine-readable, on the wire
    family: str | None      # the code this one specialises
    exit_code: int          # the CLI's exit status
    http_status: int        # the daemon's response status
    where: str              # the class that carries the code


_ROWS = (
    # code                      family             exit HTTP  class
    ("error",                   None,              1,  500, "zenedge.errors.ZenedgeError"),
    ("invalid_input",           "error",           2,  400, "zenedge.errors.InvalidInput"),
    ("config_error",            "invalid_input",   2,  400, "zenedge.errors.ConfigError"),
    ("invalid_name",            "invalid_input",   2,  400, "zenedge.errors.InvalidName"),
    ("invalid_adapter",         "invalid_input",   2,  400, "zenedge.errors.InvalidAdapter"),
    ("context_length_exceeded", "invalid_input",   2,  400, "zenedge.errors.ContextLengthExceeded"),
    ("payload_too_large",       "invalid_input",   2,  413, "zenedge.errors.PayloadTooLarge"),
    ("not_found",               "error",           1,  404, "zenedge.errors.NotFound"),
    ("adapter_not_found",       "not_found",       1,  404, "zenedge.errors.AdapterNotFound"),
    ("profile_not_found",       "not_found",       1,  404, "zenedge.errors.ProfileNotFound"),
    ("base_not_found",          "not_found",       1,  404, "zenedge.errors.BaseNotFound"),
    ("conflict",                "error",           1,  409, "zenedge.errors.Conflict"),
    ("budget_exceeded",         "conflict",        1,  507, "zenedge.errors.BudgetExceeded"),
    ("merge_rejected",          "conflict",        1,  409, "zenedge.errors.MergeRejected"),
    ("digest_mismatch",         "error",           1,  502, "zenedge.errors.DigestMismatch"),
    ("registry_error",          "error",           1,  502, "zenedge.errors.RegistryError"),
    ("store_busy",              "error",           75, 503, "zenedge.errors.StoreBusy"),  # EX_TEMPFAIL
    ("store_corrupt",           "error",           65, 500, "zenedge.errors.StoreCorrupt"),  # EX_DATAERR
    ("blob_damaged",            "store_corrupt",   65, 500, "zenedge.errors.BlobDamaged"),
    ("storage_full",            "error",           74, 507, "zenedge.errors.StorageFull"),   # EX_IOERR
    ("storage_error",           "error",           74, 500, "zenedge.errors.StorageError"),
    ("permission_denied",       "error",           77, 500, "zenedge.errors.PermissionDenied"),  # EX_NOPERM
    ("unavailable",             "error",           3,  503, "zenedge.errors.Unavailable"),
    # the daemon (zenedge/server/errors.py)
    ("queue_full",              "unavailable",     3,  503, "zenedge.server.errors.QueueFull"),
    ("shutting_down",           "unavailable",     3,  503, "zenedge.server.errors.ShuttingDown"),
    ("unauthorized",            "error",           1,  401, "zenedge.server.errors.Unauthorized"),
    ("forbidden",               "error",           1,  403, "zenedge.server.errors.Forbidden"),
    ("invalid_json",            "invalid_input",   2,  400, "zenedge.server.errors.MalformedJSON"),
    ("invalid_request",         "invalid_input",   2,  422, "zenedge.server.errors.InvalidRequest"),
    ("method_not_allowed",      "invalid_input",   2,  405, "zenedge.server.errors.MethodNotAllowed"),
    ("already_running",         "conflict",        1,  409, "zenedge.server.errors.AlreadyRunning"),
    # the merge math (zenedge/merge/errors.py)
    ("non_finite_values",       "invalid_adapter", 2,  400, "zenedge.merge.errors.NonFiniteValues"),
    ("incompatible_adapters",   "invalid_adapter", 2,  400, "zenedge.merge.errors.IncompatibleAdapters"),
    ("invalid_merge_option",    "invalid_input",   2,  400, "zenedge.merge.errors.InvalidMergeOption"),
    ("unknown_merge_method",    "invalid_input",   2,  400, "zenedge.merge.errors.UnknownMergeMethod"),
    # 1-bit deltas (zenedge/bitdelta/errors.py)
    ("invalid_bitdelta",        "invalid_input",   2,  400, "zenedge.bitdelta.errors.BitDeltaError"),
    ("invalid_bitdelta_file",   "invalid_adapter", 2,  400, "zenedge.bitdelta.errors.BitDeltaFormatError"),
    ("checkpoint_mismatch",     "invalid_bitdelta", 2, 400, "zenedge.bitdelta.errors.CheckpointMismatch"),
    # eval sets (zenedge/evaluation.py)
    ("invalid_eval_set",        "invalid_input",   2,  400, "zenedge.evaluation.EvalSetError"),
)
ERRORS: dict[str, ErrorKind] = {row[0]: ErrorKind(*row) for row in _ROWS}

_classes: dict[str, type[ZenedgeError]] = {}  # code → the class that introduced it, once declared


class ZenedgeError(Exception):
    """Base class. `code` is a stable machine-readable name used on the wire; `exit_code` and
    `http_status` come from the code's row in ERRORS."""

    code = "error"
    exit_code = 1
    http_status = 500

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "code" not in vars(cls):
            return  # a subclass that keeps its parent's code keeps its row too
        kind = ERRORS.get(cls.code)
        if kind is None:
            raise TypeError(f"{cls.__qualname__}: error code {cls.code!r} is not in zenedge.errors.ERRORS")
        cls.exit_code, cls.http_status = kind.exit_code, kind.http_status
        _classes.setdefault(cls.code, cls)

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


ZenedgeError.exit_code, ZenedgeError.http_status = ERRORS["error"].exit_code, ERRORS["error"].http_status
_classes["error"] = ZenedgeError


def error_class(code: str) -> type[ZenedgeError]:
    """The class that carries `code` in this process: its own when its module is loaded, else the
    nearest family's (every family up to ZenedgeError lives in this module)."""
    kind = ERRORS.get(code)
    while kind is not None and kind.code not in _classes:
        kind = ERRORS.get(kind.family) if kind.family else None
    return _classes[kind.code] if kind is not None else ZenedgeError


def from_wire(code: str, message: str, hint: str | None = None) -> ZenedgeError:
    """The daemon's `{"error": {"code", "message", "hint"}}` as the error it was: the same code,
    exit code and HTTP status, as an instance of its class or, where that is not loaded, of its
    family. An unknown code is a plain ZenedgeError."""
    error = error_class(code)(message, hint=hint)
    kind = ERRORS.get(code)
    if kind is not None and error.code != code:  # a family's class standing in for its member
        error.code, error.exit_code, error.http_status = kind.code, kind.exit_code, kind.http_status
    return error


class InvalidInput(ZenedgeError):
    """The user gave something we cannot use (a bad name, size, file, request)."""

    code = "invalid_input"


class ConfigError(InvalidInput):
    code = "config_error"


class InvalidName(InvalidInput):
    code = "invalid_name"


class InvalidAdapter(InvalidInput):
    """An adapter directory or file that fails validation (format, shapes, values)."""

    code = "invalid_adapter"


class ContextLengthExceeded(InvalidInput):
    """A prompt that leaves no room in the base's context; refused before any work is done."""

    code = "context_length_exceeded"


class PayloadTooLarge(InvalidInput):
    code = "payload_too_large"


class NotFound(ZenedgeError):
    code = "not_found"


class AdapterNotFound(NotFound):
    code = "adapter_not_found"


class ProfileNotFound(NotFound):
    """A name that no registry knows."""

    code = "profile_not_found"


class BaseNotFound(NotFound):
    code = "base_not_found"


class Conflict(ZenedgeError):
    code = "conflict"


class BudgetExceeded(Conflict):
    """Storing something would break the budget invariant; nothing was changed."""

    code = "budget_exceeded"


class MergeRejected(Conflict):
    code = "merge_rejected"


class DigestMismatch(ZenedgeError):
    code = "digest_mismatch"


class RegistryError(ZenedgeError):
    """A registry could not be reached or answered something unusable."""

    code = "registry_error"


class StoreBusy(ZenedgeError):
    """Another process holds the pool's writer lock for longer than we were willing to wait."""

    code = "store_busy"


class StoreCorrupt(ZenedgeError):
    """The pool's index or files are damaged: nothing is served from them or deleted because of them."""

    code = "store_corrupt"


class BlobDamaged(StoreCorrupt):
    """A stored blob whose bytes no longer match its digest, or whose tensors are not finite."""

    code = "blob_damaged"


class StorageFull(ZenedgeError):
    """The disk (or quota) holding the pool has no room for what a command writes; nothing changed."""

    code = "storage_full"


class StorageError(ZenedgeError):
    """The disk failed a read or a write for another reason (an I/O error, a missing directory)."""

    code = "storage_error"


class PermissionDenied(ZenedgeError):
    """A file or directory of the pool (or the config) cannot be written by this user: a read-only
    home, files owned by someone else."""

    code = "permission_denied"


class Unavailable(ZenedgeError):
    """A capability this machine lacks (a missing package, no GPU for a GPU-only path)."""

    code = "unavailable"


_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def from_environment(exc: BaseException) -> ZenedgeError | None:
    """A fault of the machine rather than of zenedge (a full disk, a read-only home, files owned by
    someone else, a damaged SQLite file) as the one-line error a user can act on, with its own exit
    code and HTTP status; None for anything else (a bug: the CLI shows its traceback, the daemon
    logs it). The CLI's entry point and the daemon's error handler both ask here."""
    import os
    import re
    import sqlite3

    if isinstance(exc, ZenedgeError):
        return exc
    if isinstance(exc, sqlite3.Error):
        return _from_sqlite(exc)
    if not isinstance(exc, OSError):
        # Libraries written in Rust (safetensors' SafetensorError, tokenizers) raise their own
        # types for a failed read or write, whose text ends with Rust's "(os error N)": the same
        # fault as the OSError it wraps (a full disk while the default base is converted).
        found = re.search(r"\(os error (\d+)\)", str(exc))
        if found is None:
            return None
        exc = OSError(int(found[1]), os.strerror(int(found[1])))
    if exc.errno is None:
        return None
    where = f": {exc.filename}" if exc.filename else ""
    if exc.errno in _FULL:
        return StorageFull(f"no space left on the disk{where}",
                           hint="free space on the disk that holds the zenedge home (`zenedge doctor` shows it), "
                                "then run the command again")
    if exc.errno in _DENIED:
        return PermissionDenied(f"{exc.strerror.lower() if exc.strerror else 'not permitted'}{where}",
                                hint="the zenedge home and config must be writable by you "
                                     "(ZENEDGE_HOME and ZENEDGE_CONFIG move them)")
    if exc.filename or exc.errno == errno.EIO:
        return StorageError(f"{exc.strerror or 'I/O error'}{where}")
    return None


def _from_sqlite(exc: BaseException) -> ZenedgeError:
    text = str(exc)
    lowered = text.lower()
    if "readonly" in lowered or "read-only" in lowered:
        return PermissionDenied(f"the pool's index cannot be written ({text})",
                                hint="the zenedge home must be writable by you (ZENEDGE_HOME moves it)")
    if "full" in lowered:
        return StorageFull(f"no space left for the pool's index ({text})",
                           hint="free space on the disk that holds the zenedge home, then run the command again")
    if "locked" in lowered or "busy" in lowered:
        return StoreBusy(f"the pool's index is locked by another process ({text})", hint="try again in a moment")
    if "unable to open" in lowered or "disk i/o" in lowered:
        return StorageError(f"cannot read or write the pool's index ({text})",
                            hint="check the zenedge home's disk and permissions")
    return StoreCorrupt(f"the pool's index is damaged ({text})",
                        hint="`zenedge pool recover` rebuilds it from the stored files")
