"""Who may talk to the daemon: plain ASGI middleware, outermost first.

1. LocalOnly: the Host header must name this machine (localhost, 127.0.0.1, [::1], with any port)
   on every listener, which defeats DNS rebinding (a page on evil.example that resolves to
   127.0.0.1 still sends `Host: evil.example`). A request with an Origin header must come from a
   configured origin (`server.cors_origins`, re-read on config reload); allowed origins get CORS
   headers and their preflights are answered here, before authentication. A request without an
   Origin that a browser marks as a page's (`Sec-Fetch-Site: cross-site` or `same-site`: an
   <img> or a no-cors fetch) is refused too.
2. TokenAuth: over TCP every endpoint except /health needs `Authorization: Bearer <token>`. The
   Unix socket needs none: it is 0600 in a 0700 directory, so reaching it already proves the user.
   A request whose listener cannot be told apart is treated as TCP (fail closed). With
   `server.tcp_auth = "loopback"` (re-read on reload) a client on 127.0.0.1 or ::1 needs none
   either, and whatever it sends as a token is not read (clients send "ollama" or "sk-…").
3. BodyLimit: request bodies above a limit (1 MiB) are refused with 413 before any parsing. Every
   endpoint takes JSON, so a body is parsed as JSON whatever its Content-Type says (`curl -d`
   sends form encoding): malformed JSON is then a 400, not a confusing schema error.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from typing import Callable, Iterable

from zenedge.errors import PayloadTooLarge
from zenedge.server import errors

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::[0-9]{1,5})?")
OPEN_PATHS = frozenset({"/health"})
DRAIN_LIMIT = 64 << 20  # read (and drop) this much of an oversized body so the client sees the 413
PREFLIGHT_HEADERS = "Authorization, Content-Type, Accept"
METHODS = "GET, POST, PUT, DELETE, OPTIONS"


def header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def host_allowed(value: str | None, extra: Iterable[str] = ()) -> bool:
    if not value:
        return False
    match = _HOST.fullmatch(value.strip().lower())
    return bool(match) and (match.group(1) in LOCAL_HOSTS or match.group(1) in set(extra))


def over_unix_socket(scope) -> bool:
    """ASGI reports a Unix listener as server = [path, None]; anything else counts as TCP."""
    server = scope.get("server")
    return server is not None and len(server) == 2 and server[1] is None


def from_loopback(scope) -> bool:
    """The client's address is 127.0.0.0/8 or ::1 (an IPv4-mapped ::ffff:127.x counts)."""
    client = scope.get("client")
    try:
        address = ipaddress.ip_address(client[0])
    except (TypeError, IndexError, ValueError):
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


async def _refuse(scope, receive, send, exc) -> None:
    await errors.response(exc)(scope, receive, send)


class LocalOnly:
    def __init__(self, app, origins: Callable[[], Iterable[str]], extra_hosts: Iterable[str] = ()):
        self.app = app
        self.origins = origins
        self.extra_hosts = frozenset(h.lower() for h in extra_hosts)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = header(scope, b"host")
        if not host_allowed(host, self.extra_hosts):
            return await _refuse(scope, receive, send, errors.Forbidden(
                f"Host {host!r} is not this machine; the daemon only answers localhost",
                hint="a web page reached the daemon through DNS rebinding, or a client sent a wrong Host"))
        origin = header(scope, b"origin")
        if origin is None:
            if header(scope, b"sec-fetch-site") in ("cross-site", "same-site"):
                return await _refuse(scope, receive, send, errors.Forbidden(
                    "a web page's request (Sec-Fetch-Site without an Origin) is not allowed",
                    hint="fetch with CORS from an origin in server.cors_origins"))
            return await self.app(scope, receive, send)
        if origin not in set(self.origins()):
            return await _refuse(scope, receive, send, errors.Forbidden(
                f"origin {origin!r} is not allowed", hint="add it to server.cors_origins in the config"))
        if scope["method"] == "OPTIONS" and header(scope, b"access-control-request-method"):
            return await self._preflight(origin, send)

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (b"access-control-allow-origin", origin.encode("latin-1")),
                                                  (b"vary", b"Origin")]}
            await send(message)

        return await self.app(scope, receive, send_with_cors)

    async def _preflight(self, origin: str, send) -> None:
        headers = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin"),
                   (b"access-control-allow-methods", METHODS.encode()),
                   (b"access-control-allow-headers", PREFLIGHT_HEADERS.encode()),
                   (b"access-control-max-age", b"600"), (b"content-length", b"0")]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


class TokenAuth:
    def __init__(self, app, token: str | None, loopback_is_trusted: Callable[[], bool] = lambda: False):
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None
        self.loopback_is_trusted = loopback_is_trusted

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or over_unix_socket(scope) or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        if from_loopback(scope) and self.loopback_is_trusted():
            return await self.app(scope, receive, send)
        given = (header(scope, b"authorization") or "").encode("latin-1")
        if self.expected is None or not hmac.compare_digest(given, self.expected):
            what = "a missing" if not given else "a wrong"
            return await _refuse(scope, receive, send, errors.Unauthorized(
                f"{what} bearer token", hint="send `Authorization: Bearer <token>` (the token file is "
                                             '<home>/token, or ZENEDGE_TOKEN), or set server.tcp_auth = '
                                             '"loopback" for clients on this machine'))
        return await self.app(scope, receive, send)


class BodyLimit:
    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._drain(receive, 0)
            return await self._too_large(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None  # the client left before sending its body: nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                if message.get("more_body", False):
                    await self._drain(receive, size)
                return await self._too_large(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body:
            scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers", ()) if k != b"content-type"]
                     + [(b"content-type", b"application/json")]}
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # afterwards: http.disconnect when the client leaves

        return await self.app(scope, replay, send)

    @staticmethod
    async def _drain(receive, size: int) -> None:
        while size <= DRAIN_LIMIT:
            message = await receive()
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    async def _too_large(self, scope, receive, send) -> None:
        await _refuse(scope, receive, send, PayloadTooLarge(f"request body over the {self.limit // 1024} KiB limit"))
