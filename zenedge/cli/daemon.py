"""Finding a running daemon from the CLI, cheaply.

Commands that can go through the daemon (run, pull, rm, budget set, ps) call `find_daemon()`. It costs
a stat of the socket path when no daemon runs (~5 ms of imports, well under 1 ms), and one /health
round trip over the socket (short timeout) when one does; it imports only the stdlib client (no
httpx, pydantic, FastAPI or torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zenedge import paths
from zenedge.api import discovery
from zenedge.config import Config
from zenedge.errors import Unavailable, ZenedgeError

if TYPE_CHECKING:
    from zenedge.api.client import DaemonClient

HEALTH_TIMEOUT = 1.0


def find_daemon(cfg: Config | None = None, timeout: float = HEALTH_TIMEOUT) -> DaemonClient | None:
    """A client for the daemon serving this home, or None when none is running."""
    if cfg is None:
        from zenedge.cli.context import load_config

        cfg = load_config()
    path = discovery.socket_for(cfg).path
    if not path.exists():
        return None
    from zenedge.api.client import DaemonClient, UnixTransport  # http.client costs ~30 ms: only with a socket

    client = DaemonClient(UnixTransport(str(path)))
    try:
        health = client.health(timeout=timeout)
    except ZenedgeError:
        return None  # a stale socket of a crashed daemon, or one too busy to answer: work locally
    if health.get("home_id") != discovery.home_id(paths.home()):
        return None  # a daemon of another home on a shared socket path: never touch its pool
    return client


def pull_through_daemon(client: DaemonClient, reference: str, progress=None) -> dict:
    """`zenedge pull` when a daemon is up: the same progress events and result as a local pull
    (the stream's last line is the result, marked "success"), and a merge's gate runs on the
    daemon's resident base instead of loading one in this process (~4 s of imports and weights)."""
    result: dict = {}
    for event in client.pull(reference):
        if event.get("status") == "success" and "adapter_id" in event:
            result = {key: value for key, value in event.items() if key != "status"}
        elif progress is not None:
            progress(event)
    if not result:
        raise Unavailable("the zenedge daemon's pull stream ended without a result")
    return result


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


class DaemonBudgetPlan:
    """The daemon's answer to `budget set`, shaped like pool.budget.EvictionPlan for the CLI's printing."""

    def __init__(self, answer: dict):
        self.budget, self.used_before, self.used_after = (answer["budget_bytes"], answer["used_before"],
                                                          answer["used_after"])
        self.evict = [{"names": a["names"], "kind": a["kind"], "freed": a["freed_bytes"]} for a in answer["evicted"]]
        self.names = answer["evict"]

    @classmethod
    def set_budget(cls, client: DaemonClient, size: str, dry_run: bool) -> "DaemonBudgetPlan":
        return cls(client.set_budget(size, dry_run))
