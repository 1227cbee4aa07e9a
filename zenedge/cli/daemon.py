"""Finding a running daemon from the CLI, cheaply, and starting one for `pull`, `import` and `run`.

Commands that can go through the daemon (run, pull, rm, budget set, ps) call `find_daemon()`. It costs
a stat of the socket path when no daemon runs, and one /health round trip over the socket (short
timeout) when one does; it imports only the stdlib client (no httpx, pydantic, FastAPI or torch).

`pull`, `import` and `run` go further (`find_or_start_daemon`): with no daemon up they start one in the
background that exits after `server.keep_alive` seconds with nothing to do (Ollama's keep-alive, 5
minutes by default). A fresh process pays for its imports and the base load before a merge's
quality gate reads its first row, or a generation its first token; a daemon pays them once, and the
next commands in those minutes start at once (BENCHMARKS.md, "The pool at interactive speed").
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable

from zenedge import paths
from zenedge.api import discovery
from zenedge.config import Config
from zenedge.errors import Unavailable, ZenedgeError

if TYPE_CHECKING:
    from zenedge.api.client import DaemonClient

HEALTH_TIMEOUT = 1.0
START_TIMEOUT = 60.0   # a cold start imports torch and FastAPI: seconds, far more on a loaded laptop
RACE_WAIT = 5.0        # after our daemon exited (another command's won the home): how long to wait for that one


def find_daemon(cfg: Config | None = None, timeout: float = HEALTH_TIMEOUT) -> DaemonClient | None:
    """A client for the daemon serving this home, or None when none is running."""
    if cfg is None:
        from zenedge.cli.context import load_config

        cfg = load_config()
    path = discovery.socket_for(cfg).path
    if not path.exists():
        return None
    from zenedge.api.client import DaemonClient, UnixTransport  # http.client is a slow import: only with a socket

    client = DaemonClient(UnixTransport(str(path)))
    try:
        health = client.health(timeout=timeout)
    except ZenedgeError:
        return None  # a stale socket of a crashed daemon, or one too busy to answer: work locally
    if health.get("home_id") != discovery.home_id(paths.home()):
        return None  # a daemon of another home on a shared socket path: never touch its pool
    return client


def keep_alive(cfg: Config) -> float:
    """Seconds a daemon started by the CLI stays up idle: ZENEDGE_KEEP_ALIVE, else server.keep_alive."""
    override = paths.keep_alive_from_env()
    return cfg.server.keep_alive if override is None else override


def find_or_start_daemon(cfg: Config, say: Callable[[str], None], start: bool = True) -> DaemonClient | None:
    """The running daemon, else one started now (when `start` and keep_alive > 0); None where
    neither: the command then works in this process, as it did before daemons existed."""
    client = find_daemon(cfg)
    seconds = keep_alive(cfg)
    if client is not None or seconds <= 0 or not start:
        return client
    return start_daemon(cfg, seconds, say)


def start_daemon(cfg: Config, seconds: float, say: Callable[[str], None]) -> DaemonClient | None:
    """`zenedge serve --idle-exit SECONDS` in its own session (it outlives this command), logging to
    <home>/logs/daemon.log; waits until it answers. None, with a note, when it does not come up."""
    import subprocess

    log_path = paths.home() / "logs" / "daemon.log"
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")
    except OSError as exc:   # a home we may only read: the command can still read the pool itself
        say(f"note: no zenedge daemon can start here ({exc.strerror}: {log_path}); working in this process")
        return None
    say(f"starting a zenedge daemon for this pool (it exits after {seconds:g} s with nothing to do; "
        "`zenedge stop` ends it now)")
    with log:
        started_at = log.seek(0, os.SEEK_END)   # what this daemon writes starts here
        # In the home, not the caller's directory (paths.cli_command: imports from the installation only).
        process = subprocess.Popen(
            paths.cli_command("serve", "--idle-exit", f"{seconds:g}", "--log-level", "warning"), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, cwd=paths.home())
    deadline, exited_at = time.monotonic() + START_TIMEOUT, None
    while time.monotonic() < deadline:
        client = find_daemon(cfg)
        if client is not None:
            return client
        if exited_at is None and process.poll() is not None:
            exited_at = time.monotonic()  # refused (another daemon claimed the home first) or failed
        if exited_at is not None and time.monotonic() - exited_at > RACE_WAIT:
            break
        time.sleep(0.05)
    why = last_line(log_path, started_at)
    say(f"note: the zenedge daemon did not start{f' ({why})' if why else ''}; see {log_path}; "
        "working in this process")
    return None


def last_line(path, offset: int) -> str | None:
    """The last non-empty line written to `path` after `offset` (a daemon's last word: usually its
    error), shortened to one readable line; None when it wrote nothing."""
    try:
        with open(path, "rb") as f:
            f.seek(max(offset, f.seek(0, os.SEEK_END) - 64 * 1024))
            lines = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1][:300] if lines else None


def lingering_daemon() -> int | None:
    """The pid of a daemon of this home that no longer answers but has not exited: one finishing
    its last pool job after a stop, or stuck. None when no such process lives."""
    info = discovery.read_info(paths.home())
    pid = (info or {}).get("pid")
    if not isinstance(pid, int) or pid == os.getpid() or exited(pid):
        return None
    return pid


def exited(pid: int) -> bool:
    """Whether process `pid` is gone: absent, or a zombie its parent has not reaped yet (a desktop
    app's child that exited is done serving)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def stop_daemon(cfg: Config, timeout: float = 60.0) -> dict | None:
    """Ask the running daemon to stop and wait until its process has exited (it finishes requests
    in flight within its grace period, and a pool job at its next safe point); its answer (pid,
    grace), or None when no daemon is running. Unavailable when it is still finishing after
    `timeout` seconds past its grace period."""
    client = find_daemon(cfg)
    if client is not None:
        answer = client.stop()
    else:
        pid = lingering_daemon()
        if pid is None:
            return None
        answer = {"pid": pid, "grace_seconds": 0.0}     # asked already: wait for it as well
    pid = answer["pid"]
    deadline = time.monotonic() + answer.get("grace_seconds", 0) + timeout
    while time.monotonic() < deadline:
        if exited(pid):
            return answer
        time.sleep(0.05)
    raise Unavailable(f"the zenedge daemon (pid {pid}) is still finishing its last pool job",
                      hint="it exits once that job reaches a safe point; `zenedge stop` again waits for it")


def run_through_daemon(client: DaemonClient, name: str, prompt: str, *, raw: bool, system: str | None,
                       max_tokens: int, temperature: float, top_p: float, seed: int | None,
                       stop: tuple[str, ...], json_out: bool) -> None:
    """`zenedge run` when a daemon is up: same output, no model load in this process."""
    import sys

    from zenedge.api.client import sampling_body
    from zenedge.cli.output import print_json

    body = sampling_body(name, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop)
    if raw:
        body["prompt"] = prompt
    else:
        body["messages"] = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": prompt}]
    if json_out:
        result = client.complete(body) if raw else client.chat(body)
        choice, usage = result["choices"][0], result["usage"]
        return print_json({"model": name, "text": choice["text"] if raw else choice["message"]["content"],
                           "prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                           "finish_reason": choice["finish_reason"]})
    for chunk in (client.complete_stream(body) if raw else client.chat_stream(body)):
        for choice in chunk.get("choices", ()):
            text = choice.get("text") if raw else choice.get("delta", {}).get("content")
            if text:
                sys.stdout.write(text)
                sys.stdout.flush()
    sys.stdout.write("\n")
