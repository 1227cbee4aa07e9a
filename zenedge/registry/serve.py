"""`zenedge registry serve DIR`: a static file server with HTTP Range support, on loopback by
default, for testing and for sharing a registry on a LAN."""

from __future__ import annotations

import functools
import http.server
import re
from pathlib import Path

from zenedge.paths import registry_log_requests

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class RangeRequestHandler(http.server.SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler plus single-range `Range: bytes=a-b` (206 / 416)."""

    def send_head(self):
        header = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if header is None or not path.is_file():
            return super().send_head()
        match = _RANGE.match(header.strip())
        size = path.stat().st_size
        if not match:
            self.send_error(416, "unsupported range")
            return None
        start = int(match.group(1))
        end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
        if start >= size or start > end:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.end_headers()
            return None
        handle = open(path, "rb")
        handle.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return _Limited(handle, end - start + 1)

    def log_message(self, format, *args):  # quiet unless asked
        if registry_log_requests():
            super().log_message(format, *args)


class _Limited:
    """A file object that stops after `remaining` bytes (copyfile reads until EOF)."""

    def __init__(self, handle, remaining: int):
        self.handle, self.remaining = handle, remaining

    def read(self, n: int = -1) -> bytes:
        if self.remaining <= 0:
            return b""
        n = self.remaining if n < 0 else min(n, self.remaining)
        data = self.handle.read(n)
        self.remaining -= len(data)
        return data

    def close(self) -> None:
        self.handle.close()


def make_server(directory: Path, host: str = "127.0.0.1", port: int = 0) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(RangeRequestHandler, directory=str(directory))
    return http.server.ThreadingHTTPServer((host, port), handler)
