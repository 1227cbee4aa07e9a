"""`zenedge run NAME PROMPT`: one generation, streamed to the terminal."""

from __future__ import annotations

import sys

import click

from zenedge.cli.context import load_config, open_store
from zenedge.cli.output import json_option, print_json


@click.command("run")
@click.argument("name")
@click.argument("prompt")
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Makes sampling reproducible.")
@click.option("--stop", multiple=True, help="Stop before this string (repeatable).")
@click.option("--system", default=None, help="A system message.")
@click.option("--raw", is_flag=True, help="Send PROMPT as plain text, without the chat template.")
@json_option
def run(name: str, prompt: str, max_tokens: int, temperature: float, top_p: float, seed: int | None,
        stop: tuple[str, ...], system: str | None, raw: bool, json_out: bool) -> None:
    """Generate with a profile (or a base) and stream the answer."""
    from zenedge.cli.daemon import find_or_start_daemon, run_through_daemon

    cfg = load_config()
    # A first `run` in a fresh home converts the default base (slow, its progress shown here); a
    # daemon would do that silently, so one is started only once the store has a base.
    daemon = find_or_start_daemon(cfg, say=lambda line: click.echo(line, err=True),
                                  start=bool(open_store().bases()))
    if daemon is not None:  # the daemon has the model loaded: no start-up cost here
        return run_through_daemon(daemon, name, prompt, raw=raw, system=system, max_tokens=max_tokens,
                                  temperature=temperature, top_p=top_p, seed=seed, stop=stop, json_out=json_out)
    from zenedge.runtime.engine import Engine, Prompt
    from zenedge.runtime.generate import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                            stop=tuple(stop))
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    request = Prompt(text=prompt) if raw else Prompt(messages=messages)
    engine = Engine(open_store(), cfg, progress=lambda m: click.echo(f"{m}…", err=True))
    if json_out:
        result = engine.complete(name, request, params)
        return print_json({"model": result.model, "text": result.text, "prompt_tokens": result.prompt_tokens,
                           "completion_tokens": result.completion_tokens, "finish_reason": result.finish_reason})
    for delta in engine.stream(name, request, params):
        if delta.text:
            sys.stdout.write(delta.text)
            sys.stdout.flush()
    sys.stdout.write("\n")
