"""A real HTTP registry on 127.0.0.1 for tests and the fault script: Range support (the product's
handler), plus injected faults per file and an optional throttle (bytes per second), so that a
download can be caught, dropped or killed mid-transfer."""

from __future__ import annotations

import contextlib
import functools
import http.server
import io
import json
import threading
import time
from pathlib import Path
from typing import Iterator

from tests.conftest import write_lora_dir
from zenedge.registry.builder import build_registry
from zenedge.registry.serve import RangeRequestHandler

PROFILES = [("writer", 1, 8), ("coder", 2, 32), ("writer-copy", 1, 8)]  # name, seed, rank


def build_tiny_registry(root: Path, shapes: dict[str, tuple[int, int]], base_sha256: str) -> Path:
    """Three LoRA profiles for the `tiny` base (writer-copy shares writer's weights), with eval sets."""
    for name, seed, rank in PROFILES:
        folder = root / name
        write_lora_dir(folder / "adapter", shapes, seed=seed, rank=rank)
        (folder / "eval.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}", "answer": f"a{i}"}) + "\n"
                                                   for i in range(50)))
        (folder / "recipe.json").write_text(json.dumps({
            "name": name, "version": "1.0.0", "description": f"{name} for tests", "kind": "lora",
            "license": "CC0-1.0", "metric": "exact_match", "base": {"name": "tiny", "sha256": base_sha256}}))
    build_registry(root)
    return root


class FaultyHandler(RangeRequestHandler):
    """Serves files, but can drop a connection mid-file, corrupt bytes, lie about lengths, hold a
    transfer halfway until released (`gate`), or send slowly (`throttle`, bytes per second)."""

    faults: dict = {}
    log: list = []
    throttle: float | None = None

    def send_head(self):
        self.log.append((self.path, self.headers.get("Range")))
        name = self.path.rsplit("/", 1)[-1]
        fault = self.faults.get(name)
        if fault is None:
            return super().send_head()
        path = self.translate_path(self.path)
        data = open(path, "rb").read()
        kind = fault["kind"]
        if kind == "gate" and not fault["opened"].is_set():
            return self._gated(data, fault)
        if kind == "gate":
            return super().send_head()
        if kind == "drop" and fault.get("left", 1) > 0 and not self.headers.get("Range"):
            fault["left"] = fault.get("left", 1) - 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            raise ConnectionAbortedError  # ends this request mid-body
        if kind == "drop":
            return super().send_head()
        body = {"corrupt": lambda d: d[:-1] + bytes([d[-1] ^ 0xFF]),
                "longer": lambda d: d + b"extra bytes the manifest never promised",
                "shorter": lambda d: d[:-10]}[kind](data)
        self.send_response(200)
        length = {"wrong-length": len(data) + 5, "shorter": len(data)}.get(kind, len(body))
        self.close_connection = kind in ("shorter", "wrong-length")  # promise more than sent, hang up
        self.send_header("Content-Length", str(length))
        self.end_headers()
        return io.BytesIO(body)

    def _gated(self, data, fault):
        """The first request for the file sends half its body, then waits until the test opens
        the gate: a download caught mid-transfer for as long as the test needs (no sleeps)."""
        fault["opened"].set()  # later requests for the file are served whole
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        fault["halfway"].set()
        fault["release"].wait(120)
        self.wfile.write(data[len(data) // 2:])
        return None

    def copyfile(self, source, outputfile):
        try:
            if not self.throttle:
                return super().copyfile(source, outputfile)
            chunk = 4096
            while data := source.read(chunk):
                outputfile.write(data)
                outputfile.flush()
                time.sleep(len(data) / self.throttle)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def handle_one_request(self):
        try:
            super().handle_one_request()
        except ConnectionAbortedError:
            self.close_connection = True


@contextlib.contextmanager
def serve_registry(directory: Path, throttle: float | None = None) -> Iterator[tuple[str, type[FaultyHandler]]]:
    """(base URL, handler class) of a registry served from `directory` on a free loopback port; set
    faults in `handler.faults[file name]`, read requests from `handler.log`."""
    handler = type("Handler", (FaultyHandler,), {"faults": {}, "log": [], "throttle": throttle})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
