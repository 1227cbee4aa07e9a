"""Where a command that changes the pool does its work: through the daemon, or in this process.

`backend(cfg, start=...)` is the one place the choice is made. The running daemon is used when
there is one: its pool work is queued with everyone else's (server/pool_jobs.py) and its caches
follow every change. Commands that load the base (pull, import, merge, compress, pool maintain)
start one on demand when none runs (`server.keep_alive`; 0 means never), so a second command does
not pay for the base again; the others (rm, pin, budget set) work in this process when no daemon
runs. Both backends take the same calls and give the same results and errors, so a command never
knows which one it has.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

import click

from zenedge.config import Config
from zenedge.errors import Unavailable

if TYPE_CHECKING:
    from zenedge.api.client import DaemonClient

Progress = Callable[[dict[str, Any]], None]


class Backend(Protocol):
    where: str     # "daemon" or "local"

    def pull(self, reference: str, progress: Progress | None = None) -> dict[str, Any]: ...

    def import_(self, path: Path, name: str, base: str | None, eval_path: Path | None,
                progress: Progress | None = None) -> dict[str, Any]: ...

    def rm(self, name: str) -> dict[str, Any]: ...

    def pin(self, name: str, pinned: bool) -> dict[str, Any]: ...

    def set_budget(self, size: str, dry_run: bool, progress=None) -> dict[str, Any]: ...

    def merge(self, names: list[str], method: str, force: bool, progress: Progress | None = None) -> dict[str, Any]: ...

    def compress(self, finetuned: Path, name: str, *, base: str, distill: bool, steps: int, eval_path: Path | None,
                 output: Path | None, progress: Progress | None = None) -> dict[str, Any]: ...

    def maintain(self) -> dict[str, Any]: ...


def backend(cfg: Config, *, start: bool) -> Backend:
    """The daemon serving this home, one started now when `start` (and server.keep_alive allows),
    or this process."""
    from zenedge.cli.daemon import find_or_start_daemon

    client = find_or_start_daemon(cfg, say=lambda line: click.echo(line, err=True), start=start)
    return ThroughDaemon(client) if client is not None else Local(cfg)


class ThroughDaemon:
    where = "daemon"

    def __init__(self, client: DaemonClient):
        self.client = client

    def pull(self, reference, progress=None):
        return _result_of(self.client.pull(reference), progress)

    def import_(self, path, name, base, eval_path, progress=None):
        # The daemon reads the files: absolute paths, as this process resolves them.
        events = self.client.import_(str(path.absolute()), name, base, str(eval_path.absolute()) if eval_path else None)
        return _result_of(events, progress)

    def rm(self, name):
        return self.client.rm(name)

    def pin(self, name, pinned):
        return self.client.pin(name, pinned)

    def set_budget(self, size, dry_run, progress=None):
        return self.client.set_budget(size, dry_run)

    def merge(self, names, method, force, progress=None):
        return _result_of(self.client.merge(names, method, force), progress)

    def compress(self, finetuned, name, *, base, distill, steps, eval_path, output, progress=None):
        fields = {"finetuned": str(finetuned.absolute()), "name": name, "base": base, "distill": distill,
                  "steps": steps, "eval": str(eval_path.absolute()) if eval_path else None,
                  "output": str(output.absolute()) if output else None}
        return _result_of(self.client.compress(**fields), progress)

    def maintain(self):
        return self.client.maintain()


class Local:
    where = "local"

    def __init__(self, cfg: Config):
        from zenedge.cli.context import open_store

        self.cfg = cfg
        self.store = open_store()

    def pull(self, reference, progress=None):
        from zenedge.pool.pull import pull

        return pull(self.store, self.cfg, reference, progress=progress).as_dict()

    def import_(self, path, name, base, eval_path, progress=None):
        from zenedge.pool import import_path

        return import_path(self.store, self.cfg, path, name, base=base, eval_path=eval_path,
                           progress=progress).as_dict()

    def rm(self, name):
        return self.store.remove_name(name)

    def pin(self, name, pinned):
        row = self.store.set_pinned(name, pinned)
        return {"name": name, "adapter_id": row["id"], "pinned": bool(row["pinned"])}

    def set_budget(self, size, dry_run, progress=None):
        from zenedge.pool import set_budget

        plan = set_budget(self.store, self.cfg, size, dry_run=dry_run, progress=progress)
        return plan.as_dict(dry_run)

    def merge(self, names, method, force, progress=None):
        from zenedge.pool import manual_merge

        return manual_merge(self.store, self.cfg, names, method, force=force, progress=progress)

    def compress(self, finetuned, name, *, base, distill, steps, eval_path, output, progress=None):
        from zenedge.pool import compress_finetune

        def say(line: str) -> None:
            if progress is not None:
                progress({"status": line, "phase": "compress"})
        return compress_finetune(self.store, self.cfg, finetuned, name, base=base, distill=distill, steps=steps,
                                 eval_path=eval_path, output=output, progress=say, base_progress=say)

    def maintain(self):
        from zenedge.pool.maintain import maintain

        return maintain(self.store, self.cfg)


def _result_of(events: Iterator[dict[str, Any]], progress: Progress | None) -> dict[str, Any]:
    """A daemon job's NDJSON stream: progress lines to `progress`, the last line (status
    "success", with the result's fields) returned."""
    result: dict[str, Any] = {}
    for event in events:
        if event.get("status") == "success" and "adapter_id" in event:
            result = {key: value for key, value in event.items() if key != "status"}
        elif progress is not None:
            progress(event)
    if not result:
        raise Unavailable("the zenedge daemon's stream ended without a result",
                          hint="it may have been stopped; see <home>/logs/daemon.log or run the command again")
    return result
