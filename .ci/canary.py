"""CI's canary: what a new user gets today, not what the lock pins.

    python3.11 .ci/canary.py [--locked .venv] [--newest .venv-newest]

1. The README's quick start, exactly as written but without `-c constraints.txt` (so pip takes the
   newest versions the registry serves) and in its own venv, from the clone's root.
2. The README's "From apps" flow in that venv: `zenedge serve --tcp`, one `openai` and one
   `ollama` client call.
3. 128 decoded tokens on the default base (tools/decode_rate.py), alternating between the locked
   venv (the suite's, made by the README's test command) and the newest one on the same home; the
   newest must decode at ≥ 0.8× the locked one (a ratio within one run, never a timing).

Any failure ends it with exit 1 and names the packages whose versions differ from the lock.
Standard library only: it runs before and beside the venvs it checks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIN_RATIO = 0.8
ROUNDS = 3          # per venv, alternating; each reports its best of 3 decodes

CLIENTS = """
import sys
import ollama
from openai import OpenAI

port, token = sys.argv[1], sys.argv[2]
question = [{"role": "user", "content": "Explain generators."}]
openai_client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token)
answer = openai_client.chat.completions.create(model="writer", messages=question, max_tokens=16)
assert answer.choices[0].message.content, answer
print("openai:", answer.choices[0].message.content.replace("\\n", " "))
ollama_client = ollama.Client(host=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"})
reply = ollama_client.chat(model="writer", messages=question, options={"num_predict": 16})
assert reply.message.content, reply
print("ollama:", reply.message.content.replace("\\n", " "))
"""


class CanaryFailed(Exception):
    pass


def say(text: str) -> None:
    print(f"canary: {text}", flush=True)


def run(argv: list[str] | str, *, step: str, env: dict, timeout: float, shell: bool = False) -> str:
    """Run one step from the clone's root; its output is shown, and a failure names the step."""
    say(f"{step} ...")
    done = subprocess.run(argv, cwd=REPO, env=env, shell=shell, executable="/bin/bash" if shell else None,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise CanaryFailed(f"{step} exited {done.returncode}:\n{output[-4000:]}")
    return done.stdout


def quick_start(newest: str) -> str:
    """The README's quick-start command, in the `newest` venv, without the lock."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Quick start"):]
    block = re.search(r"```sh\n(.*?)\n```", section, re.S).group(1)
    if "-c constraints.txt " not in block:
        raise CanaryFailed("the README's quick start no longer installs with -c constraints.txt")
    return re.sub(r"\.venv\b", newest, block.replace("-c constraints.txt ", ""))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def from_apps(newest: Path, env: dict, home: Path) -> None:
    run([str(newest / "bin" / "pip"), "install", "-q", "openai", "ollama"], step="installing the newest openai and ollama clients",
        env=env, timeout=600)
    port = free_port()
    say(f"zenedge serve --tcp 127.0.0.1:{port} ...")
    server = subprocess.Popen([str(newest / "bin" / "zenedge"), "serve", "--tcp", f"127.0.0.1:{port}"], cwd=REPO,
                              env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        deadline = time.monotonic() + 120
        while not (home / "token").exists() or not _listening(port):
            if server.poll() is not None:
                raise CanaryFailed(f"zenedge serve exited {server.returncode}:\n{server.stdout.read()[-4000:]}")
            if time.monotonic() > deadline:
                raise CanaryFailed("zenedge serve --tcp did not answer within 120 s")
            time.sleep(0.2)
        token = (home / "token").read_text().strip()
        print(run([str(newest / "bin" / "python"), "-c", CLIENTS, str(port), token],
                  step="one openai and one ollama call", env=env, timeout=300).strip())
    finally:
        subprocess.run([str(newest / "bin" / "zenedge"), "stop"], cwd=REPO, env=env, capture_output=True, timeout=120)
        if server.poll() is None:
            server.kill()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def decode_rates(locked: Path, newest: Path, env: dict) -> tuple[float, float]:
    best = {"locked": 0.0, "newest": 0.0}
    for round_ in range(1, ROUNDS + 1):
        for label, venv in (("locked", locked), ("newest", newest)):
            # by path, not `-m tools…`: the script's folder, not the root, goes first on sys.path
            out = run([str(venv / "bin" / "python"), str(REPO / "tools" / "decode_rate.py")],
                      step=f"decode round {round_}, {label} venv", env=env, timeout=600)
            result = json.loads(out.strip().splitlines()[-1])
            path = result["decode_path"]
            say(f"  {result['tokens_per_s']:.1f} tok/s ({label}: transformers {result['versions']['transformers']}, "
                f"{path['forward']} forward, native {path['native_isa'] or 'off'})")
            best[label] = max(best[label], result["tokens_per_s"])
    return best["locked"], best["newest"]


def freeze(venv: Path) -> dict[str, str]:
    done = subprocess.run([str(venv / "bin" / "pip"), "freeze", "--exclude-editable"], capture_output=True, text=True)
    return dict(_pin(line) for line in done.stdout.splitlines() if "==" in line)


def _pin(line: str) -> tuple[str, str]:
    name, version = line.split("==", 1)
    return re.sub(r"[-_.]+", "-", name).lower(), version.strip()


def differences(newest: Path) -> list[str]:
    """Each package whose version in the newest venv differs from the lock's: the suspects."""
    lock = dict(_pin(line) for line in (REPO / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    found = freeze(newest) if (newest / "bin" / "pip").exists() else {}
    return [f"{name} {found.get(name, 'absent')} (lock: {version})" for name, version in sorted(lock.items())
            if found.get(name) != version and name in found] + \
           [f"{name} {version} (not in the lock)" for name, version in sorted(found.items()) if name not in lock
            and name not in ("torch", "openai", "ollama")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locked", type=Path, default=REPO / ".venv")
    parser.add_argument("--newest", type=Path, default=REPO / ".venv-newest")
    args = parser.parse_args()
    locked, newest = args.locked.resolve(), args.newest.resolve()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="zenedge-canary-") as scratch:
        home = Path(scratch) / "home"
        env = {**os.environ, "ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(Path(scratch) / "config.toml"),
               "XDG_RUNTIME_DIR": scratch}
        env.pop("ZENEDGE_KEEP_ALIVE", None)
        try:
            answer = run(quick_start(os.path.relpath(newest, REPO)), shell=True, env=env, timeout=1800,
                         step="the README's quick start with the newest versions")
            last = answer.strip().splitlines()[-1] if answer.strip() else ""   # after pip's own output
            if not last or last.startswith(("Successfully installed", "Requirement already")):
                raise CanaryFailed("the quick start's `zenedge run` answered nothing")
            say(f"answer: {last[:200]}")
            from_apps(newest, env, home)
            locked_rate, newest_rate = decode_rates(locked, newest, env)
            ratio = newest_rate / locked_rate
            say(f"decode: newest {newest_rate:.1f} tok/s, locked {locked_rate:.1f} tok/s: {ratio:.2f}x "
                f"(at least {MIN_RATIO}x needed)")
            if ratio < MIN_RATIO:
                raise CanaryFailed(f"the newest stack decodes at {ratio:.2f}x the locked one")
        except (CanaryFailed, subprocess.TimeoutExpired) as exc:
            say(f"FAILED: {exc}")
            suspects = differences(newest)
            say("the newest stack differs from the lock in: " + ("; ".join(suspects) if suspects else "nothing"))
            return 1
    suspects = differences(newest)
    say(f"passed in {time.monotonic() - started:.0f} s; the newest stack differs from the lock in: "
        + ("; ".join(suspects) if suspects else "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
