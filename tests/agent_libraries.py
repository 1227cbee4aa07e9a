"""How often what agent libraries send comes back valid, on the real default base: each case of
tests/server/test_agent_libraries.py, then the overlay's (tests/overlay_clients.py: instructor,
litellm, hanzo-llm, llama-index), over seeds 0..N-1 (20 by default), as a table.

    python -m tests.agent_libraries                    # 20 seeds per case (about 25 minutes on 2 cores)
    python -m tests.agent_libraries --seeds 5 --out benchmarks/DATE-agent-libraries.md
    python -m tests.agent_libraries --case json_mode   # the cases whose name holds this

"Valid" is what the library itself accepts: a pydantic instance, a parsed dict, tool calls whose
arguments validate against the function's schema. The answers are seeded, so a table reproduces.
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path
from typing import Callable

import jsonschema

from tests import overlay
from tests.server.harness import ThreadDaemon, one_torch_thread, write_config
from tests.server.test_agent_libraries import (ASK_CITY, ASK_WEATHER, MODEL, City, chat_ollama, chat_openai, weather,
                                               weather_schema)


def cases(urls: dict) -> dict[str, Callable[[int], object]]:
    """Name → one seeded try, returning what the library returned (raising where it refused)."""
    import ollama
    import openai
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.ollama import OllamaProvider
    from pydantic_ai.providers.openai import OpenAIProvider

    def calls_valid(calls: list[dict]) -> list[dict]:
        for call in calls:
            jsonschema.validate(call["args"], weather_schema())
        return calls

    def agent(provider, output):
        model = OpenAIChatModel(MODEL, provider=provider(base_url=urls["v1"], api_key=urls["token"]))
        run = Agent(model, output_type=output, retries=0)
        return lambda seed: run.run_sync(ASK_CITY, model_settings={"max_tokens": 160, "seed": seed}).output

    client = openai.OpenAI(base_url=urls["v1"], api_key=urls["token"], max_retries=0)
    local = ollama.Client(host=urls["api"], headers={"Authorization": f"Bearer {urls['token']}"})
    tool = {"type": "function", "function": {"name": "weather", "description": weather.__doc__,
                                             "parameters": weather_schema()}}

    def openai_required(seed):
        call = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK_WEATHER}],
                                              tools=[tool], tool_choice="required", max_tokens=160,
                                              seed=seed).choices[0].message.tool_calls[0]
        return calls_valid([{"args": json.loads(call.function.arguments)}])

    return {
        "langchain-openai with_structured_output json_schema":
            lambda seed: chat_openai(urls, seed).with_structured_output(City).invoke(ASK_CITY),
        "langchain-openai with_structured_output function_calling":
            lambda seed: chat_openai(urls, seed).with_structured_output(City, method="function_calling").invoke(
                ASK_CITY),
        "langchain-openai json_mode":
            lambda seed: chat_openai(urls, seed).with_structured_output(None, method="json_mode").invoke(
                ASK_CITY + " Answer in JSON."),
        "langchain-openai bind_tools tool_choice=any":
            lambda seed: calls_valid(chat_openai(urls, seed).bind_tools([weather], tool_choice="any")
                                     .invoke(ASK_WEATHER).tool_calls) or None,
        "langchain-ollama with_structured_output json_schema":
            lambda seed: chat_ollama(urls, seed).with_structured_output(City).invoke(ASK_CITY),
        "langchain-ollama json_mode":
            lambda seed: chat_ollama(urls, seed).with_structured_output(None, method="json_mode").invoke(
                ASK_CITY + " Answer in JSON."),
        "pydantic-ai OpenAIProvider tool output": agent(OpenAIProvider, City),
        "pydantic-ai OpenAIProvider NativeOutput": agent(OpenAIProvider, NativeOutput(City)),
        "pydantic-ai OllamaProvider tool output": agent(OllamaProvider, City),
        "pydantic-ai OllamaProvider NativeOutput": agent(OllamaProvider, NativeOutput(City)),
        "openai chat.completions.parse":
            lambda seed: client.chat.completions.parse(
                model=MODEL, messages=[{"role": "user", "content": ASK_CITY}], response_format=City, max_tokens=160,
                seed=seed).choices[0].message.parsed,
        "openai tool_choice=required": openai_required,
        "ollama format=schema":
            lambda seed: City.model_validate_json(local.chat(
                model=MODEL, messages=[{"role": "user", "content": ASK_CITY}], format=City.model_json_schema(),
                options={"num_predict": 160, "seed": seed}).message.content),
    }


def real_daemon(root: Path) -> ThreadDaemon:
    from zenedge import bases
    from zenedge.digests import file_sha256
    from zenedge.store import Store

    converted, home, config = root / "hf", root / "home", root / "config.toml"
    bases.convert_gguf(bases.default_base_gguf(), converted)
    write_config(config, {"runtime": {"device": "cpu", "dtype": "float32", "weights": "full"}})
    store = Store(home)
    bases.add_hf_dir(store, converted, bases.DEFAULT_BASE, aliases=bases.DEFAULT_BASE_ALIASES,
                     sha256=file_sha256(bases.default_base_gguf()))
    store.close()
    return ThreadDaemon.start(home, config)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.agent_libraries", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    parser.add_argument("--case", default="", help="only the cases whose name contains this")
    parser.add_argument("--no-overlay", action="store_true",
                        help="leave out the overlay's libraries (instructor, litellm, hanzo-llm, llama-index)")
    args = parser.parse_args()
    from zenedge.bench.throughput import machine

    rows = []
    with tempfile.TemporaryDirectory() as tmp, one_torch_thread():
        daemon = real_daemon(Path(tmp))
        try:
            urls = {"v1": f"{daemon.tcp_url}/v1", "api": daemon.tcp_url, "token": daemon.token}
            for name, attempt in cases(urls).items():
                if args.case not in name:
                    continue
                began, valid, failures = time.perf_counter(), 0, []
                for seed in range(args.seeds):
                    try:
                        valid += attempt(seed) is not None
                    except Exception as exc:   # the library refused the answer: count it, say why
                        failures.append(f"seed {seed}: {type(exc).__name__}: {' '.join(str(exc).split())[:120]}")
                rows.append((name, valid, time.perf_counter() - began, failures))
                print(f"{name}: {valid}/{args.seeds}", flush=True)
            if not args.no_overlay:   # instructor, litellm, hanzo-llm, llama-index (tests/overlay.py)
                for r in overlay.run_clients(urls, args.seeds, args.case):
                    rows.append((r["case"], r["valid"], r["seconds"], r["failures"]))
                    print(f"{r['case']}: {r['valid']}/{args.seeds}", flush=True)
        finally:
            daemon.stop()
    host = machine()
    lines = [f"# Agent libraries on {MODEL}, {datetime.date.today()}", "",
             f"CPU: {host['cpu']}, {host['cores']} cores; torch {host['torch']}; {args.seeds} seeds per case "
             "(python -m tests.agent_libraries).", "",
             "| case | valid | s per try |", "|---|---|---|"]
    lines += [f"| {name} | {valid}/{args.seeds} | {seconds / args.seeds:.1f} |" for name, valid, seconds, _ in rows]
    failed = [f"- {name}: {failure}" for name, _, _, failures in rows for failure in failures]
    lines += (["", "Failures:", *failed] if failed else [])
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        args.out.write_text(table)


if __name__ == "__main__":
    main()
