"""Verified, resumable HTTP downloads.

A file is fetched into `<partial dir>/<sha256>.part`; an interrupted transfer (dropped
connection, killed process) resumes from the bytes already on disk with an HTTP Range request.
Retries back off exponentially. The body is checked against the manifest: a server that sends
more bytes than promised, a Content-Length that disagrees, or a digest mismatch ends with the
partial file deleted and a clear error. Only a verified file is handed back.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from zenedge.digests import file_sha256
from zenedge.errors import DigestMismatch, RegistryError

CHUNK = 1 << 14  # small enough that a dropped connection loses little
Progress = Callable[[int], None]  # called with the number of new bytes


def fetch(client, url: str, dest: Path, *, sha256: str, size: int, progress: Progress | None = None,
          retries: int = 5, backoff: float = 0.5) -> Path:
    """Download `url` to `dest` (a `.part` path), resuming and verifying; returns `dest`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and dest.stat().st_size > size:
        dest.unlink()  # a stale partial bigger than the file: start over
    attempt = 0
    while True:
        have = dest.stat().st_size if dest.exists() else 0
        if progress and attempt == 0 and have:
            progress(have)
        try:
            if have < size:
                _transfer(client, url, dest, have, size, progress)
            break
        except (RegistryError, DigestMismatch):
            raise
        except Exception as exc:  # network trouble: retry from what we have
            attempt += 1
            if attempt > retries:
                raise RegistryError(f"download of {url} failed after {retries} retries: {exc}",
                                    hint="run the same pull again to resume") from None
            time.sleep(backoff * 2 ** (attempt - 1))
    digest = file_sha256(dest)
    if digest != sha256:
        dest.unlink(missing_ok=True)
        raise DigestMismatch(f"{url}: sha256 is {digest[:16]}…, the manifest says {sha256[:16]}…; the file was deleted",
                             hint="the registry serves corrupted or changed files")
    return dest


def _transfer(client, url: str, dest: Path, have: int, size: int, progress: Progress | None) -> None:
    headers = {"Range": f"bytes={have}-"} if have else {}
    with client.stream("GET", url, headers=headers) as response:
        if response.status_code == 404:
            raise RegistryError(f"{url}: not found on the registry (404)")
        if response.status_code >= 400:
            raise OSError(f"HTTP {response.status_code}")  # retried
        if have and response.status_code != 206:
            have = 0  # the server ignored Range: start over, truncating
        expected = size - have
        length = response.headers.get("content-length")
        if length is not None and int(length) != expected:
            raise RegistryError(f"{url}: server announces {length} bytes, the manifest needs {expected}")
        mode = "ab" if have else "wb"
        received = 0
        with open(dest, mode) as out:
            for chunk in response.iter_bytes(CHUNK):
                received += len(chunk)
                if received > expected:
                    out.close()
                    dest.unlink(missing_ok=True)
                    raise RegistryError(f"{url}: the server sent more than the {size} bytes in the manifest")
                out.write(chunk)
                if progress:
                    progress(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        if received < expected:
            raise OSError(f"connection closed after {have + received} of {size} bytes")  # retried, resumes
