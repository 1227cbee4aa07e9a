"""The typed error hierarchy, and the one place that maps errors to exit codes and HTTP statuses.

Every error message is one line a user can act on. Layers raise these; the CLI turns them into
`error: <message>` + exit code, the server into `{"error": {"code", "message"}}` + status.
"""

from __future__ import annotations


class ZenedgeError(Exception):
    """Base class. `code` is a stable machine-readable name used on the wire."""

    code = "error"
    exit_code = 1
    http_status = 500

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class InvalidInput(ZenedgeError):
    """The user gave something we cannot use (a bad name, size, file, request)."""

    code = "invalid_input"
    exit_code = 2
    http_status = 400


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
    http_status = 413


class NotFound(ZenedgeError):
    code = "not_found"
    http_status = 404


class AdapterNotFound(NotFound):
    code = "adapter_not_found"


class ProfileNotFound(NotFound):
    """A name that no registry knows."""

    code = "profile_not_found"


class BaseNotFound(NotFound):
    code = "base_not_found"


class Conflict(ZenedgeError):
    code = "conflict"
    http_status = 409


class BudgetExceeded(Conflict):
    """Storing something would break the budget invariant; nothing was changed."""

    code = "budget_exceeded"
    http_status = 507


class MergeRejected(Conflict):
    code = "merge_rejected"


class DigestMismatch(ZenedgeError):
    code = "digest_mismatch"
    http_status = 502


class RegistryError(ZenedgeError):
    """A registry could not be reached or answered something unusable."""

    code = "registry_error"
    http_status = 502


class StoreBusy(ZenedgeError):
    """Another process holds the pool's writer lock for longer than we were willing to wait."""

    code = "store_busy"
    exit_code = 75  # EX_TEMPFAIL: try again later
    http_status = 503


class StoreCorrupt(ZenedgeError):
    code = "store_corrupt"
    exit_code = 3


class Unavailable(ZenedgeError):
    """A capability this machine lacks (a missing package, no GPU for a GPU-only path)."""

    code = "unavailable"
    exit_code = 3
    http_status = 503
