"""The client: every daemon endpoint over an httpx transport (Unix socket or TCP + bearer token).

Streams are generators; closing one early (break, or the generator being garbage-collected)
closes the connection, and the daemon cancels that generation.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Iterator, Optional

import httpx

from zenedge_client import wire


class ZenedgeError(Exception):
    """An error the daemon reported: HTTP status plus its stable `code` (e.g. "adapter_not_found")."""

    def __init__(self, message: str, status: int, code: str, hint: Optional[str] = None,
                 retry_after: Optional[float] = None):
        super().__init__(f"{message} ({hint})" if hint else message)
        self.message, self.status, self.code, self.hint, self.retry_after = message, status, code, hint, retry_after

    @classmethod
    def from_body(cls, status: int, body: Any, retry_after: Optional[float] = None) -> "ZenedgeError":
        detail = body.get("error") if isinstance(body, dict) else None
        if isinstance(detail, dict) and isinstance(detail.get("code"), str):
            return cls(str(detail.get("message", "")), status, detail["code"], detail.get("hint"), retry_after)
        return cls(f"the daemon answered HTTP {status}", status, "http_error", None, retry_after)


class DaemonUnavailable(ZenedgeError):
    """Nothing answered (no daemon, a stale socket) or the connection broke."""

    def __init__(self, where: str, cause: object):
        super().__init__(f"cannot reach the zenedge daemon at {where}: {cause}", 0, "unavailable")


class ZenedgeClient:
    def __init__(self, transport: httpx.BaseTransport, *, base_url: str = "http://localhost",
                 token: Optional[str] = None, timeout: float = 600.0, where: str = ""):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.where = where or base_url
        self._http = httpx.Client(transport=transport, base_url=base_url, headers=headers, timeout=timeout)

    @classmethod
    def unix(cls, socket_path: str, **options: Any) -> "ZenedgeClient":
        """Over the daemon's Unix socket (its 0600 mode is the credential: no token)."""
        return cls(httpx.HTTPTransport(uds=str(socket_path)), where=f"unix:{socket_path}", **options)

    @classmethod
    def tcp(cls, url: str, token: str, **options: Any) -> "ZenedgeClient":
        """Over loopback TCP, e.g. url="http://127.0.0.1:11435", with the daemon's bearer token."""
        return cls(httpx.HTTPTransport(), base_url=url, token=token, where=url, **options)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ZenedgeClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- OpenAI-compatible -------------------------------------------------------------------
    def health(self, timeout: Optional[float] = None) -> wire.Health:
        return self._json("GET", "/health", timeout=timeout)

    def models(self) -> wire.ModelList:
        return self._json("GET", "/v1/models")

    def chat(self, request: wire.ChatCompletionRequest) -> wire.ChatCompletion:
        return self._json("POST", "/v1/chat/completions", {**request, "stream": False})

    def chat_stream(self, request: wire.ChatCompletionRequest) -> Iterator[wire.ChatCompletionChunk]:
        return self._events("/v1/chat/completions", {**request, "stream": True})

    def complete(self, request: wire.CompletionRequest) -> wire.Completion:
        return self._json("POST", "/v1/completions", {**request, "stream": False})

    def complete_stream(self, request: wire.CompletionRequest) -> Iterator[wire.Completion]:
        return self._events("/v1/completions", {**request, "stream": True})

    def embeddings(self, request: wire.EmbeddingRequest) -> wire.EmbeddingList:
        """Unit vectors from the profile (or base) named by `model`, one per input, as floats."""
        return self._json("POST", "/v1/embeddings", {**request, "encoding_format": "float"})

    # -- native ------------------------------------------------------------------------------
    def list(self) -> wire.PoolList:
        return self._json("GET", "/api/list")

    def ps(self) -> wire.Ps:
        return self._json("GET", "/api/ps")

    def rm(self, name: str) -> wire.RmResult:
        return self._json("POST", "/api/rm", {"name": name})

    def budget(self) -> wire.BudgetStatus:
        return self._json("GET", "/api/budget")

    def set_budget(self, size: str, dry_run: bool = False) -> wire.BudgetPlan:
        return self._json("PUT", "/api/budget", {"size": size, "dry_run": dry_run})

    def pool(self) -> wire.PoolStatus:
        return self._json("GET", "/api/pool")

    def maintain(self) -> wire.MaintainResult:
        return self._json("POST", "/api/pool")

    def pull(self, name: str) -> Iterator[wire.PullProgress]:
        """Progress lines; the last has status "success" and the pulled profile's fields."""
        with self._stream("POST", "/api/pull", {"name": name, "stream": True}) as response:
            for line in response.iter_lines():
                if line:
                    event = json.loads(line)
                    if "error" in event:
                        raise ZenedgeError.from_body(200, event)
                    yield event

    # -- plumbing ----------------------------------------------------------------------------
    def _json(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None) -> Any:
        try:
            response = self._http.request(method, path, json=body, timeout=timeout or self._http.timeout)
        except httpx.TransportError as exc:
            raise DaemonUnavailable(self.where, exc) from None
        self._raise_for(response)
        return response.json()

    @contextlib.contextmanager
    def _stream(self, method: str, path: str, body: Any) -> Iterator[httpx.Response]:
        """A streamed response; leaving the block closes the connection (which cancels a generation)."""
        try:
            with self._http.stream(method, path, json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    self._raise_for(response)
                yield response
        except httpx.TransportError as exc:
            raise DaemonUnavailable(self.where, exc) from None

    def _events(self, path: str, body: Any) -> Iterator[Any]:
        with self._stream("POST", path, body) as response:
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if isinstance(event, dict) and "error" in event:
                    raise ZenedgeError.from_body(200, event)
                yield event
        raise DaemonUnavailable(self.where, "the stream ended without [DONE]")

    @staticmethod
    def _raise_for(response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        retry = response.headers.get("retry-after")
        raise ZenedgeError.from_body(response.status_code, body, float(retry) if retry else None)
