"""What the pool is doing, shown to a person: a bar per downloaded file (bytes, speed, ETA) and a
line per pool phase (ranking, merging into X, checking quality of members, evicting Y), then one
sentence saying what happened. Events are the dicts `pool.pull` and `zenedge.pool` report
(pool/phases.py); `--json` prints them as they are instead."""

from __future__ import annotations

from typing import Any

import click

from zenedge.sizes import format_size

QUIET = {"success", "resolving", "verifying", "committing"}


class PoolProgress:
    """Bars start with the first file (an import or a merge has none: plain lines, no empty bar)."""

    def __enter__(self) -> "PoolProgress":
        self.progress = None
        self.files: dict[str, int] = {}
        return self

    def update(self, event: dict[str, Any]) -> None:
        if "file" in event and "total" in event:
            progress = self._bars()
            task = self.files.get(event["file"])
            if task is None:
                task = self.files[event["file"]] = progress.add_task(event["file"], total=event["total"])
            progress.update(task, completed=event["completed"])
        elif event.get("phase") or event.get("status") not in QUIET:  # pool phases: one line each
            self._line(event["status"])

    def _bars(self):
        if self.progress is None:
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                     TransferSpeedColumn(), TimeRemainingColumn(), transient=False)
            self.progress.__enter__()
        return self.progress

    def _line(self, text: str) -> None:
        if self.progress is not None:
            self.progress.console.print(f"[dim]{text}[/dim]", highlight=False)
        else:
            click.secho(text, dim=True)

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)


def compressed(steps: list[dict[str, Any]]) -> str:
    """The adapters stored smaller to make room (shrink.py's kept steps), in one phrase."""
    kept = [s for s in steps or [] if s.get("kept")]
    if not kept:
        return ""
    parts = [f"{'+'.join(s['names'])} as {s['compressed_to']} (keeps {min(s['retention'].values(), default=0):.3f})"
             for s in kept]
    freed = sum(s["freed_bytes"] for s in kept)
    return f"stored {', '.join(parts)}: {format_size(freed)} freed"


def describe(result: dict[str, Any]) -> str:
    """What the pool did to admit a profile, in one sentence (import and pull results)."""
    action = result.get("policy") or result.get("action")
    seconds = (result.get("profile") or {}).get("total_seconds")
    took = f" in {seconds:.1f} s" if seconds else ""
    room = compressed(result.get("compressed") or [])
    if room:
        rest = describe({k: v for k, v in result.items() if k != "compressed"})
        return f"{room}; {rest}" if rest else f"{room}{took}"
    if action == "merged":
        attempt = next((a for a in reversed(result.get("attempts") or []) if a.get("accepted")), {})
        kept = ", ".join(f"{n} {r:.2f}" for n, r in (attempt.get("retention") or {}).items())
        return (f"merged with {', '.join(result.get('merged_with') or [])} (quality kept: {kept}){took}"
                if kept else f"merged with {', '.join(result.get('merged_with') or [])}{took}")
    if action == "evicted":
        tried = len(result.get("attempts") or [])
        why = f"no merge kept quality ({tried} tried); " if tried else ""
        return f"{why}evicted {', '.join(result.get('evicted') or [])} to make room{took}"
    return ""


def echo_outcome(headline: str, result: dict[str, Any]) -> None:
    click.echo(headline)
    detail = describe(result)
    if detail:
        click.echo(f"  {detail}")
