"""Running real daemons for tests: in a thread of the test process (fast: torch is already
imported) or as a `zenedge serve` subprocess (signals, exit codes, a second start)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.conftest import tiny_module_shapes, write_lora_dir

PROFILES = ("p0", "p1", "p2", "p3")
DEFAULT_CONFIG = {"runtime": {"device": "cpu", "dtype": "float32"}, "server": {"max_queue": 64}}


def write_config(path: Path, sections: dict) -> None:
    """A config file from {section: {key: value}} (JSON scalars and string lists are valid TOML)."""
    path.write_text("".join(f"[{section}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in keys.items())
                            + "\n" for section, keys in sections.items()))


@contextlib.contextmanager
def one_torch_thread():
    """The tiny model gains nothing from intra-op threads, and on a 2-core machine shared with the
    test process's own threads they cost 10x: ZENEDGE_THREADS=1 for the engines made in the block
    (daemons in threads of this process, CLI subprocesses); restored afterwards."""
    from zenedge.runtime import threads

    before = os.environ.get("ZENEDGE_THREADS")
    os.environ["ZENEDGE_THREADS"] = "1"
    threads.configure()
    try:
        yield
    finally:
        if before is None:
            del os.environ["ZENEDGE_THREADS"]
        else:
            os.environ["ZENEDGE_THREADS"] = before
        threads.configure()


def make_home(root: Path, tiny_base_dir: Path, *, profiles=PROFILES, config: dict | None = None) -> tuple[Path, Path]:
    """A home with the tiny base registered as `tiny` (and as `forever`, a copy whose end-of-sequence
    token is out of its vocabulary, so generations run until max_tokens or cancellation), and a
    LoRA profile per name; `config` overrides DEFAULT_CONFIG per section. Returns (home, config path)."""
    from zenedge import bases, pool
    from zenedge import config as config_mod
    from zenedge.store import Store

    root.mkdir(parents=True, exist_ok=True)
    home, config_path = root / "home", root / "config.toml"
    sections = {s: dict(keys) for s, keys in DEFAULT_CONFIG.items()}
    for section, keys in (config or {}).items():
        sections.setdefault(section, {}).update(keys)
    write_config(config_path, sections)
    cfg = config_mod.load(config_path)
    store = Store(home)
    bases.add_hf_dir(store, tiny_base_dir, "tiny")
    forever = root / "forever-base"
    shutil.copytree(tiny_base_dir, forever)
    generation = json.loads((forever / "generation_config.json").read_text())
    (forever / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": 10**6}))
    model_config = json.loads((forever / "config.json").read_text())   # a context that never ends either
    (forever / "config.json").write_text(json.dumps({**model_config, "max_position_embeddings": 1 << 20}))
    bases.add_hf_dir(store, forever, "forever")
    shapes = tiny_module_shapes(tiny_base_dir)
    for seed, name in enumerate(profiles):
        lora = write_lora_dir(root / f"lora-{name}", shapes, seed=seed + 1, scale=0.3)
        pool.import_lora(store, cfg, lora, name, base="tiny")
    store.close()
    return home, config_path


@dataclass
class Endpoint:
    home: Path
    config_path: Path
    socket: Path
    tcp_url: str | None
    token: str | None
    extra: dict = field(default_factory=dict)

    def uds(self, **kwargs) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://localhost",
                            timeout=kwargs.pop("timeout", 120), **kwargs)

    def tcp(self, token: str | None = "<own>", **kwargs) -> httpx.Client:
        token = self.token if token == "<own>" else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.tcp_url, headers=headers, timeout=kwargs.pop("timeout", 120), **kwargs)

    def env(self) -> dict[str, str]:
        """Environment for a CLI subprocess that should find this daemon."""
        return {"ZENEDGE_HOME": str(self.home), "ZENEDGE_CONFIG": str(self.config_path), "XDG_RUNTIME_DIR": ""}


class ThreadDaemon(Endpoint):
    """A real daemon (uvicorn on a Unix socket + 127.0.0.1) inside the test process."""

    @classmethod
    def start(cls, home: Path, config_path: Path, token: str = "test-token", grace: float = 5.0) -> "ThreadDaemon":
        from zenedge import config
        from zenedge.api import discovery
        from zenedge.server.daemon import Daemon
        from zenedge.server.settings import Settings

        choice = discovery.choose_socket("", home / "run", home)
        settings = Settings(home=home, config_path=config_path, socket=choice.path, socket_is_default=True,
                            tcp=("127.0.0.1", 0), token=token, token_source="test", grace_seconds=grace,
                            config_poll_seconds=0.2)
        daemon = Daemon(settings, config.load(config_path), announce=lambda line: None)
        failure: list[BaseException] = []

        def run():
            try:
                daemon.run()
            except BaseException as exc:  # surfaced by start()
                failure.append(exc)

        thread = threading.Thread(target=run, name="test-daemon", daemon=True)
        thread.start()
        while not daemon.started.wait(0.05):
            if failure:
                raise failure[0]
            assert thread.is_alive(), "the daemon thread died"
        self = cls(home, config_path, choice.path, f"http://127.0.0.1:{daemon.tcp_port}", token)
        self.daemon, self.thread = daemon, thread
        return self

    def stop(self) -> None:
        self.daemon.request_exit()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the daemon did not stop"


class ProcessDaemon(Endpoint):
    """`python -m zenedge.cli serve` in a subprocess (its own signals, exit code, stderr)."""

    @classmethod
    def start(cls, home: Path, config_path: Path, *args: str, token: str = "proc-token",
              wait: bool = True) -> "ProcessDaemon":
        env = {**os.environ, "ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path),
               "ZENEDGE_TOKEN": token, "XDG_RUNTIME_DIR": "", "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen([sys.executable, "-m", "zenedge.cli", "serve", "--tcp", "127.0.0.1:0",
                                    "--log-level", "warning", *args],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self = cls(home, config_path, Path(), None, token)
        self.process = process
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        from zenedge.api import discovery

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"serve exited {self.process.returncode}: {self.process.stderr.read()}"
            info = discovery.read_info(self.home)
            if info and info["pid"] == self.process.pid:
                self.socket = Path(info["socket"])
                self.tcp_url = f"http://{info['tcp']}"
                return
            time.sleep(0.1)
        raise AssertionError("the daemon did not start in time")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


def chat_body(model: str, content: str, max_tokens: int = 12, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


def sse_events(lines) -> list:
    """The JSON payloads of an SSE stream, and "[DONE]" for the terminator."""
    events = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def stream_text(client: httpx.AsyncClient, body: dict) -> tuple[str, str | None, bool]:
    """Stream a chat completion: (text, finish_reason, ended with [DONE])."""
    text, reason, done = "", None, False
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += choice["delta"].get("content") or ""
            reason = choice.get("finish_reason") or reason
    return text, reason, done
