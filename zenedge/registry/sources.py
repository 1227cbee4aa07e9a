"""Where manifests and files come from: the embedded registry (profiles/ shipped with zenedge)
or a static HTTP(S) server with the same layout."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from zenedge.errors import DigestMismatch, RegistryError
from zenedge.digests import file_sha256
from zenedge.registry.download import Progress, fetch
from zenedge.registry.manifest import IndexEntry, Manifest, parse_index, parse_manifest

MAX_METADATA_BYTES = 4 * 2**20


def embedded_root() -> Path:
    """The embedded registry's folder: zenedge/profiles inside an installed wheel, the checkout's
    top-level profiles/ under an editable install (profiles/ is a data folder with no
    `__init__.py`, so that it never shadows a package called `profiles`; setuptools' editable
    finder does not map such a folder, hence the second place)."""
    spec = importlib.util.find_spec("zenedge.profiles")
    places = list(spec.submodule_search_locations or ()) if spec is not None else []
    places.append(Path(__file__).resolve().parents[2] / "profiles")   # <checkout>/zenedge/registry/sources.py
    for place in map(Path, places):
        if (place / "index.json").is_file():
            return place
    raise RegistryError("the embedded registry is missing from this installation")


class DirectorySource:
    """A registry on the local file system (the embedded one, or a folder the user points at)."""

    def __init__(self, root: Path, label: str):
        self.root = Path(root)
        self.label = label

    def index(self) -> list[IndexEntry]:
        path = self.root / "index.json"
        if not path.is_file():
            raise RegistryError(f"{self.label}: no index.json")
        return parse_index(path.read_bytes(), f"{self.label}/index.json")

    def manifest(self, entry: IndexEntry) -> tuple[Manifest, str]:
        path = self.root / entry.manifest
        if not path.is_file():
            raise RegistryError(f"{self.label}: missing {entry.manifest}")
        return parse_manifest(path.read_bytes(), f"{self.label}/{entry.manifest}"), str(Path(entry.manifest).parent)

    def fetch(self, folder: str, relative: str, dest: Path, *, sha256: str, size: int,
              progress: Progress | None = None) -> Path:
        source = self.root / folder / relative
        if not source.is_file() or source.stat().st_size != size:
            raise RegistryError(f"{self.label}: {folder}/{relative} is missing or has the wrong size")
        shutil.copyfile(source, dest)
        if progress:
            progress(size)
        if file_sha256(dest) != sha256:
            dest.unlink()
            raise DigestMismatch(f"{self.label}: {folder}/{relative} does not match its sha256")
        return dest


class HttpSource:
    """A registry served by any static file server (Range support lets downloads resume)."""

    def __init__(self, url: str, timeout: float = 30.0):
        import httpx

        self.url = url.rstrip("/")
        self.label = self.url
        self.client = httpx.Client(timeout=timeout, follow_redirects=True,
                                   headers={"User-Agent": "zenedge"})

    def _get_small(self, relative: str) -> bytes:
        import httpx

        url = f"{self.url}/{relative}"
        try:
            with self.client.stream("GET", url) as response:
                if response.status_code == 404:
                    raise RegistryError(f"{url}: not found (404)")
                if response.status_code >= 400:
                    raise RegistryError(f"{url}: HTTP {response.status_code}")
                body = b""
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_METADATA_BYTES:
                        raise RegistryError(f"{url}: metadata larger than {MAX_METADATA_BYTES} bytes")
                return body
        except httpx.HTTPError as exc:
            raise RegistryError(f"registry {self.url} is unreachable: {exc.__class__.__name__}: {exc}",
                                hint="check the URL in registry.urls and your connection") from None

    def index(self) -> list[IndexEntry]:
        return parse_index(self._get_small("index.json"), f"{self.url}/index.json")

    def manifest(self, entry: IndexEntry) -> tuple[Manifest, str]:
        data = self._get_small(entry.manifest)
        return parse_manifest(data, f"{self.url}/{entry.manifest}"), str(Path(entry.manifest).parent)

    def fetch(self, folder: str, relative: str, dest: Path, *, sha256: str, size: int,
              progress: Progress | None = None) -> Path:
        prefix = f"{folder}/" if folder and folder != "." else ""
        return fetch(self.client, f"{self.url}/{prefix}{relative}", dest, sha256=sha256, size=size,
                     progress=progress)


def open_source(url: str):
    if url == "embedded":
        return DirectorySource(embedded_root(), "embedded registry")
    if url.startswith(("http://", "https://")):
        return HttpSource(url)
    if url.startswith("file://"):
        return DirectorySource(Path(url[len("file://"):]), url)
    raise RegistryError(f"unsupported registry URL {url!r}", hint='use "embedded", http(s)://… or file://…')
