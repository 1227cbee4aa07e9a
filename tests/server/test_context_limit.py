"""A prompt that does not fit the base's context (the tiny base: 128 positions) is refused up front:
a 400 naming the context length and the prompt's tokens from both OpenAI routes, streamed or not,
and one `error:` line with exit 2 from `zenedge run`, with or without a daemon. The daemon keeps
serving; a prompt that fits but asks for more tokens than the room left stops at the context's
end ("length")."""

from __future__ import annotations

import re

from tests.conftest import run_cli
from tests.server.harness import chat_body, make_home

CONTEXT = 128


def many_messages(count: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(count)]


def assert_refused(response, min_tokens: int = CONTEXT) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert f"context length is {CONTEXT:,} tokens" in error["message"]
    prompt_tokens = int(re.search(r"the prompt is ([\d,]+) tokens", error["message"]).group(1).replace(",", ""))
    assert prompt_tokens >= min_tokens


def test_a_chat_far_past_the_context_is_a_400_before_any_work(daemon):
    """The defect as found: 10,000 messages (about 65k tokens against an 8k context) grew the
    daemon by gigabytes and tried to allocate a 4.2 GB mask. Here: 10,000 messages, 128 positions."""
    body = {**chat_body("p0", ""), "messages": many_messages(10_000)}
    with daemon.uds() as http:
        before = http.get("/api/ps").json()["scheduler"]
        assert_refused(http.post("/v1/chat/completions", json=body), min_tokens=10_000)
        assert_refused(http.post("/v1/chat/completions", json={**body, "stream": True}), min_tokens=10_000)
        after = http.get("/api/ps").json()["scheduler"]
        assert after["failed"] == before["failed"] + 2 and after["completed"] == before["completed"]
        fine = http.post("/v1/chat/completions", json=chat_body("p0", "hello", max_tokens=4))
        assert fine.status_code == 200 and fine.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_completion_prompt_at_the_context_length_is_a_400(daemon):
    with daemon.uds() as http:
        assert_refused(http.post("/v1/completions", json={"model": "tiny", "prompt": "x" * CONTEXT, "max_tokens": 4}))
        almost = http.post("/v1/completions", json={"model": "tiny", "prompt": "x" * (CONTEXT - 3),
                                                     "max_tokens": 50, "temperature": 0})
    assert almost.status_code == 200                        # room for 3 tokens: they come, then "length"
    assert almost.json()["usage"]["completion_tokens"] <= 3
    if almost.json()["choices"][0]["finish_reason"] == "length":
        assert almost.json()["usage"]["completion_tokens"] == 3


def test_zenedge_run_refuses_it_in_one_line_with_or_without_a_daemon(daemon, tmp_path, tiny_base_dir):
    through_daemon = run_cli("run", "p0", "x" * 200, "--raw", env=daemon.env())
    home, config_path = make_home(tmp_path / "local", tiny_base_dir)
    local = run_cli("run", "p0", "x" * 200, "--raw",
                    env={"ZENEDGE_HOME": str(home), "ZENEDGE_CONFIG": str(config_path), "XDG_RUNTIME_DIR": ""})
    for result in (through_daemon, local):
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: the prompt is 200 tokens"), result.stderr
        assert f"context length is {CONTEXT:,} tokens" in lines[0] and result.stdout == ""
