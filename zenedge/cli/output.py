"""Printing for the CLI: JSON for scripts, rich tables for people (rich imported only when used)."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def print_table(rows: Iterable[Sequence[Any]], columns: Sequence[str], title: str | None = None,
                empty: str = "nothing to show") -> None:
    rows = list(rows)
    if not rows:
        print(empty)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console().print(table)


def ago(seconds: float) -> str:
    if seconds < 90:
        return f"{int(seconds)}s ago"
    if seconds < 5400:
        return f"{int(seconds // 60)}m ago"
    if seconds < 129600:
        return f"{int(seconds // 3600)}h ago"
    return f"{int(seconds // 86400)}d ago"


def json_option(fn):
    """`--json` on every listing."""
    import click

    return click.option("--json", "json_out", is_flag=True, help="Machine-readable output.")(fn)
