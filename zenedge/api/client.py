"""The CLI's client for the daemon: stdlib http.client over an injected transport.

The transport decides where bytes go (the CLI's is the daemon's Unix socket); the client knows
the endpoints and turns the wire's `{"error": {"code", ...}}` back into the error the daemon
raised, through the one error table (zenedge.errors.from_wire), so a command fails with the same
message and exit code whether it ran locally or through the daemon. Request bodies follow
zenedge.api.wire (a test validates every body built here against those types).
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any, Iterator, Protocol

from zenedge import errors
from zenedge.errors import ZenedgeError


class Transport(Protocol):
    host_header: str

    def connection(self, timeout: float) -> http.client.HTTPConnection: ...

    def headers(self) -> dict[str, str]: ...


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class UnixTransport:
    host_header = "localhost"

    def __init__(self, path: str):
        self.path = str(path)

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        return _UnixConnection(self.path, timeout)

    def headers(self) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        return f"unix:{self.path}"


def error_from_wire(status: int, body: Any) -> ZenedgeError:
    """The daemon's error body → the error with that code (same class family and exit code as a local run)."""
    detail = body.get("error") if isinstance(body, dict) else None
    if not isinstance(detail, dict):
        return ZenedgeError(f"the daemon answered HTTP {status}: {str(body)[:200]}")
    return errors.from_wire(str(detail.get("code")), str(detail.get("message") or f"HTTP {status}"),
                            hint=detail.get("hint"))


class DaemonClient:
    def __init__(self, transport: Transport, timeout: float = 600.0):
        self.transport = transport
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"DaemonClient({self.transport!r})"

    # -- plumbing ------------------------------------------------------------------------------
    def _open(self, method: str, path: str, body: Any = None, timeout: float | None = None):
        connection = self.transport.connection(self.timeout if timeout is None else timeout)
        headers = {"Host": self.transport.host_header, "Accept": "application/json", **self.transport.headers()}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise errors.Unavailable(f"cannot reach the zenedge daemon at {self.transport!r}: {exc}") from None
        if response.status >= 400:
            raw = response.read()
            connection.close()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            raise error_from_wire(response.status, parsed)
        return connection, response

    def _json(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        connection, response = self._open(method, path, body, timeout)
        try:
            return json.loads(response.read())
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise errors.Unavailable(f"the zenedge daemon's answer was cut short: {exc}") from None
        finally:
            connection.close()

    def _lines(self, method: str, path: str, body: Any) -> Iterator[bytes]:
        connection, response = self._open(method, path, body)
        try:
            while line := response.readline():
                yield line.rstrip(b"\r\n")
        except (OSError, http.client.HTTPException) as exc:
            raise errors.Unavailable(f"lost the connection to the zenedge daemon: {exc}") from None
        finally:
            connection.close()  # also what cancels a generation when the caller stops early

    def _events(self, path: str, body: Any) -> Iterator[dict]:
        """Server-sent events until `data: [DONE]`; an `error` event raises."""
        for line in self._lines("POST", path, body):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            event = json.loads(data)
            if "error" in event:
                raise error_from_wire(200, event)
            yield event

    # -- endpoints -----------------------------------------------------------------------------
    def health(self, timeout: float | None = None) -> dict:
        return self._json("GET", "/health", timeout=timeout)

    def chat(self, body: dict) -> dict:
        return self._json("POST", "/v1/chat/completions", {**body, "stream": False})

    def chat_stream(self, body: dict) -> Iterator[dict]:
        return self._events("/v1/chat/completions", {**body, "stream": True,
                                                     "stream_options": {"include_usage": True}})

    def complete(self, body: dict) -> dict:
        return self._json("POST", "/v1/completions", {**body, "stream": False})

    def complete_stream(self, body: dict) -> Iterator[dict]:
        return self._events("/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})

    def ps(self) -> dict:
        return self._json("GET", "/api/ps")

    def rm(self, name: str) -> dict:
        return self._json("POST", "/api/rm", {"name": name})

    def set_budget(self, size: str, dry_run: bool = False) -> dict:
        return self._json("PUT", "/api/budget", {"size": size, "dry_run": dry_run})

    def _progress(self, path: str, body: Any) -> Iterator[dict]:
        """An NDJSON job's progress dicts; the last has status "success" and the result. An error line raises."""
        for line in self._lines("POST", path, body):
            if not line:
                continue
            event = json.loads(line)
            if "error" in event:
                raise error_from_wire(200, event)
            yield event

    def pull(self, name: str) -> Iterator[dict]:
        return self._progress("/api/pull", {"name": name, "stream": True})

    def import_(self, path: str, name: str, base: str | None = None, eval_path: str | None = None) -> Iterator[dict]:
        """Like `pull`: progress dicts, the last with status "success" and the result (Unix socket only)."""
        return self._progress("/api/import", {"path": path, "name": name, "base": base, "eval": eval_path, "stream": True})

    def pin(self, name: str, pinned: bool = True) -> dict:
        return self._json("POST", "/api/pin", {"name": name, "pinned": pinned})

    def merge(self, names: list[str], method: str, force: bool = False) -> Iterator[dict]:
        """Like `pull`: progress dicts, the last with status "success" and the result."""
        return self._progress("/api/merge", {"names": list(names), "method": method, "force": force, "stream": True})

    def compress(self, **fields: Any) -> Iterator[dict]:
        """Like `pull` (Unix socket only: the daemon reads the files; absolute paths)."""
        return self._progress("/api/compress", {**fields, "stream": True})

    def maintain(self) -> dict:
        return self._json("POST", "/api/pool")

    def stop(self) -> dict:
        return self._json("POST", "/api/stop")


def sampling_body(model: str, *, max_tokens: int, temperature: float, top_p: float, seed: int | None,
                  stop: tuple[str, ...] | list[str]) -> dict:
    """The sampling fields of a /v1 request, as `zenedge run` sends them."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}
    if seed is not None:
        body["seed"] = seed
    if stop:
        body["stop"] = list(stop)
    return body
