"""`zenedge serve` (the daemon), `zenedge stop` and `zenedge ps` (what it holds in memory)."""

from __future__ import annotations

import click

from zenedge.cli.context import load_config
from zenedge.cli.output import json_option, print_json, print_table
from zenedge.sizes import format_size


@click.command("serve")
@click.option("--socket", "socket_path", default=None, help="Unix socket path (default: server.socket or the runtime dir).")
@click.option("--tcp", default=None, metavar="HOST:PORT",
              help="Also listen on loopback TCP (bearer token required), e.g. 127.0.0.1:11435; port 0 picks one.")
@click.option("--allow-remote", is_flag=True, help="Allow a non-loopback --tcp address (the token is still required).")
@click.option("--grace", type=float, default=10.0, show_default=True,
              help="Seconds in-flight requests get to finish on SIGTERM/SIGINT.")
@click.option("--config-poll", type=float, default=2.0, show_default=True,
              help="Seconds between checks of the config file for edits (0: reload on SIGHUP only).")
@click.option("--idle-exit", type=click.FloatRange(min=0, max=365 * 24 * 3600), default=0.0, show_default=True, metavar="SECONDS",
              help="Exit after this many seconds without a request (0: never). `pull`, `import` and `run` start "
                   "daemons with server.keep_alive here.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def serve(socket_path: str | None, tcp: str | None, allow_remote: bool, grace: float, config_poll: float,
          idle_exit: float, log_level: str) -> None:
    """Run the daemon: OpenAI-compatible /v1 and native /api over a Unix socket (and optional TCP)."""
    import logging

    from zenedge.server import instance, settings as settings_mod

    cfg = load_config()
    settings = settings_mod.resolve(cfg, socket=socket_path, tcp=tcp, allow_remote=allow_remote,
                                    grace_seconds=grace, config_poll_seconds=config_poll,
                                    idle_exit_seconds=idle_exit)
    # Claim the home before paying for torch and FastAPI: a second daemon is refused in milliseconds.
    # A daemon a command started on demand hands over to one started here (not to another on demand).
    claim = (instance.claim(settings.home, settings.socket) if idle_exit > 0
             else instance.take_over(settings.home, settings.socket, say=lambda line: click.echo(line, err=True)))
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from zenedge.server.daemon import Daemon

    Daemon(settings, cfg).run(claim)


@click.command("stop")
@json_option
def stop(json_out: bool) -> None:
    """Stop the running daemon (its requests in flight get the grace period to finish)."""
    from zenedge.cli.daemon import stop_daemon

    answer = stop_daemon(load_config())
    if json_out:
        return print_json({"stopped": answer is not None, "pid": answer["pid"] if answer else None})
    click.echo(f"stopped the zenedge daemon (pid {answer['pid']})" if answer else "no zenedge daemon is running")


@click.command("ps")
@json_option
def ps(json_out: bool) -> None:
    """What the running daemon holds: resident bases, cached variants, memory, queue, in-flight requests."""
    from zenedge.cli.daemon import find_daemon, lingering_daemon
    from zenedge.errors import Unavailable

    cfg = load_config()
    daemon = find_daemon(cfg)
    if daemon is None:
        pid = lingering_daemon()
        if pid is not None:
            raise Unavailable(f"the zenedge daemon (pid {pid}) is shutting down: it no longer takes requests",
                              hint="`zenedge stop` waits for it to exit")
        raise Unavailable("no zenedge daemon is running", hint="start one with `zenedge serve`")
    status = daemon.ps()
    if json_out:
        return print_json(status)
    queue = status["scheduler"]
    click.echo(f"{status['device']} {status['dtype']}; memory {format_size(status['rss_bytes'])}; "
               f"cache {format_size(status['cache_used_bytes'])} of {format_size(status['cache_budget_bytes'])}; "
               f"{queue['running']} running, {queue['queued']} queued (max {queue['max_queue']})")
    print_table([(b["name"], "base", "", f"{b['load_seconds']:.2f}s", "", "") for b in status["bases"]] +
                [(", ".join(v["names"]) or v["key"][:12], v["kind"], format_size(v["bytes"]), f"{v['load_seconds']:.2f}s",
                  v["requests"], status["inflight"].get(v["key"], 0)) for v in status["variants"]],
                ["NAME", "KIND", "SIZE", "LOAD", "REQUESTS", "IN FLIGHT"], empty="nothing loaded yet")
