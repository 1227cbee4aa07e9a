"""The one place where exceptions become HTTP responses.

Every error body is `{"error": {"code", "message", "hint"?}}`. ZenedgeError subclasses carry their
own `code`, and their `http_status` comes from that code's row in zenedge.errors.ERRORS; the few
errors that only exist on the wire are declared here, in the same hierarchy and the same table.
FastAPI's own errors are converted: malformed JSON → 400, schema violations → 422, unknown routes
→ 404, anything unexpected → 500 with the traceback in the daemon's log and never in the response.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from zenedge.dependencies import from_dependency
from zenedge.errors import Conflict, InvalidInput, NotFound, Unavailable, ZenedgeError, from_environment

log = logging.getLogger("zenedge.server")


class QueueFull(Unavailable):
    code = "queue_full"
    retry_after = 1


class ShuttingDown(Unavailable):
    code = "shutting_down"


class Unauthorized(ZenedgeError):
    code = "unauthorized"


class Forbidden(ZenedgeError):
    code = "forbidden"


class MalformedJSON(InvalidInput):
    code = "invalid_json"


class InvalidRequest(InvalidInput):
    """The body parsed but does not fit the schema."""

    code = "invalid_request"


class MethodNotAllowed(InvalidInput):
    code = "method_not_allowed"


class AlreadyRunning(Conflict):
    code = "already_running"


class ClientGone(Exception):
    """The client disconnected; nobody is left to answer (not an error anyone reads: no code)."""


def payload(exc: ZenedgeError) -> dict[str, Any]:
    detail: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.hint:
        detail["hint"] = exc.hint
    return {"error": detail}


def response(exc: BaseException, shape: Callable[[ZenedgeError], dict[str, Any]] = payload):
    """The HTTP response for any exception (unexpected ones are logged, not shown). `shape`: the
    body's form (the Ollama-compatible routes answer `{"error": "message"}`)."""
    from starlette.responses import JSONResponse  # here, so that the error classes stay importable cheaply

    exc = _known(exc, "while serving a request")
    headers = {}
    if isinstance(exc, QueueFull):
        headers["Retry-After"] = str(exc.retry_after)
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(shape(exc), status_code=exc.http_status, headers=headers)


def stream_payload(exc: BaseException) -> dict[str, Any]:
    """An error that happens after a stream has started travels as one last event."""
    return payload(_known(exc, "while streaming"))


def _known(exc: BaseException, doing: str) -> ZenedgeError:
    """The error a client gets: a zenedge error as it is, a fault of the machine (a full disk, a
    read-only home, a damaged index) as its one line (errors.from_environment), a dependency that
    fails to import as the line that names it (dependencies.from_dependency), and anything else
    as "internal error", its traceback in the daemon's log only."""
    known = from_environment(exc)
    if known is not None:
        if known is not exc:
            log.warning("%s: %s", doing, known)
        return known
    broken = from_dependency(exc)
    if broken is not None:   # the traceback is what its maintainers (or we) will ask for
        log.error("%s: %s", doing, broken, exc_info=exc)
        return broken
    log.error("unexpected error %s", doing, exc_info=exc)
    return ZenedgeError("internal error in the zenedge daemon (details are in its log)")


def validation_error(errors: list[dict[str, Any]]) -> InvalidInput:
    """FastAPI's validation errors → MalformedJSON (400) or InvalidRequest (422), with a short description."""
    if any(e.get("type") == "json_invalid" for e in errors):
        ctx = next((e.get("ctx") or {} for e in errors if e.get("type") == "json_invalid"), {})
        return MalformedJSON(f"malformed JSON body: {ctx.get('error', 'cannot parse')}")
    return InvalidRequest(f"invalid request: {_describe_validation(errors)}")


def unparsable_body(cause: BaseException | None) -> MalformedJSON:
    """A body that is JSON in form but cannot be parsed (nested past the parser's depth, not
    UTF-8): FastAPI reports it as a bare 400, the client gets the same code as any malformed JSON."""
    reason = ("nested too deeply" if isinstance(cause, RecursionError)
              else "not valid UTF-8" if isinstance(cause, UnicodeDecodeError) else "cannot parse")
    return MalformedJSON(f"malformed JSON body: {reason}")


def _describe_validation(errors: list[dict[str, Any]]) -> str:
    parts = []
    for error in errors[:3]:
        where = ".".join(str(p) for p in error.get("loc", ())[1:]) or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def install(app) -> None:
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    async def on_zenedge_error(request, exc: ZenedgeError):
        return response(exc)

    async def on_validation_error(request, exc: RequestValidationError):
        return response(validation_error(list(exc.errors())))

    async def on_http_error(request, exc: HTTPException):
        if exc.status_code == 404:
            return response(NotFound(f"no endpoint {request.method} {request.url.path}"))
        if exc.status_code == 405:
            return response(MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}"))
        if exc.status_code == 400:  # FastAPI's answer to a body json.loads could not finish
            return response(unparsable_body(exc.__cause__))
        error = ZenedgeError(str(exc.detail))
        error.http_status = exc.status_code  # Starlette's own errors keep their status
        return response(error)

    async def on_client_gone(request, exc):
        from starlette.responses import Response

        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    async def on_unexpected(request, exc: Exception):
        return response(exc)

    app.add_exception_handler(ZenedgeError, on_zenedge_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(ClientGone, on_client_gone)
    app.add_exception_handler(Exception, on_unexpected)
