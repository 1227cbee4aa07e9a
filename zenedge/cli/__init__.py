"""The `zenedge` command line (click; rich only when a table is printed).

Importing this module must stay cheap: no torch, transformers, triton or peft here or at the top
of the command modules; each command imports what it needs when it runs.
"""

from __future__ import annotations

import sys

import click

from zenedge import __version__
from zenedge.cli import base_cmds, budget_cmds, compress_cmds, doctor_cmds, export_cmds, merge_cmds, pool_cmds, registry_cmds, run_cmds
from zenedge.cli import serve_cmds
from zenedge.cli import bench_cmds
from zenedge.dependencies import from_dependency
from zenedge.errors import ZenedgeError, from_environment
from zenedge.runtime import threads


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="zenedge", message="%(prog)s %(version)s")
def app() -> None:
    """One resident base model, many fine-tuned variants (LoRA / 1-bit BitDelta) in a storage budget."""


pool_cmds.register(app)
app.add_command(budget_cmds.budget)
app.add_command(base_cmds.base)
app.add_command(run_cmds.run)
app.add_command(merge_cmds.merge)
app.add_command(compress_cmds.compress)
app.add_command(export_cmds.export)
app.add_command(doctor_cmds.doctor)
app.add_command(serve_cmds.serve)
app.add_command(serve_cmds.stop)
app.add_command(serve_cmds.ps)
app.add_command(bench_cmds.bench)
for command in (registry_cmds.search, registry_cmds.pull, registry_cmds.registry):
    app.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one line on stderr and a meaningful exit code for every known failure."""
    threads.prepare_environment()   # before any command imports torch (which starts OpenMP)
    try:
        code = app.main(args=argv, prog_name="zenedge", standalone_mode=False)
        if isinstance(code, int):  # click returns Exit codes instead of raising without standalone mode
            return code
    except ZenedgeError as exc:  # local or from the daemon: the exit code of its row in errors.ERRORS
        _error(str(exc))
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()  # a bare `zenedge pool`: the help is the answer
        return exc.exit_code
    except click.UsageError as exc:  # one line, not click's usage + hint + error
        command = exc.ctx.command_path if exc.ctx else "zenedge"
        _error(f"{exc.format_message().rstrip('.')} (see `{command} --help`)")
        return exc.exit_code
    except click.ClickException as exc:
        _error(exc.format_message())
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        return 130
    except Exception as exc:  # a full disk, a read-only home, a damaged index, a broken dependency: one line;
        fault = from_environment(exc) or from_dependency(exc)   # a bug: its traceback
        if fault is None:
            raise
        _error(str(fault))
        return fault.exit_code
    return 0


def _error(message: str) -> None:
    """One `error:` line on stderr, whatever the message holds (a library's text may span lines)."""
    click.echo("error: " + " ".join(message.splitlines()), err=True)


if __name__ == "__main__":
    sys.exit(main())
