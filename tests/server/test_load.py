"""Load and backpressure through HTTP: 32 concurrent streams over 4 profiles lose nothing; a full
queue answers 503 + Retry-After; a client that leaves cancels its generation."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx

from tests.server.harness import PROFILES, chat_body, stream_text

STREAMS = 32


def request_for(i: int) -> dict:
    return chat_body(PROFILES[i % len(PROFILES)], f"request {i}: " + "abc"[i % 3] * (i % 7), max_tokens=16)


def test_32_concurrent_streams_over_4_profiles_lose_nothing(daemon, record_property):
    with daemon.uds() as http:  # each request alone first: the reference
        alone = [http.post("/v1/chat/completions", json=request_for(i)).json()["choices"][0] for i in range(STREAMS)]
        batches_before = http.get("/api/ps").json()["scheduler"]["batches"]

    async def all_at_once():
        transport = httpx.AsyncHTTPTransport(uds=str(daemon.socket))
        limits = httpx.Limits(max_connections=STREAMS)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=300,
                                     limits=limits) as client:
            return await asyncio.gather(*(stream_text(client, request_for(i)) for i in range(STREAMS)))

    started = time.perf_counter()
    results = asyncio.run(all_at_once())
    wall = time.perf_counter() - started
    for i, ((text, reason, done), reference) in enumerate(zip(results, alone)):
        assert done and reason == reference["finish_reason"], i
        assert text == reference["message"]["content"], i
    with daemon.uds() as http:
        assert http.get("/health").status_code == 200
        stats = http.get("/api/ps").json()["scheduler"]
    assert stats["failed"] == 0 and stats["queued"] == 0 and stats["largest_batch"] > 1
    batches = stats["batches"] - batches_before
    assert batches < STREAMS  # requests shared batches
    record_property("load_32_streams_wall_seconds", round(wall, 2))
    record_property("load_32_streams_batches", batches)
    print(f"\n32 streams: {wall:.2f}s wall in {batches} batches (largest {stats['largest_batch']})")


def test_full_queue_is_503_with_retry_after_and_leaving_cancels(fresh_daemon):
    daemon = fresh_daemon(config={"server": {"max_queue": 2}})
    endless = chat_body("forever", "go on", max_tokens=65536)
    with daemon.uds() as http, daemon.uds() as watcher:
        with http.stream("POST", "/v1/chat/completions", json={**endless, "stream": True}) as stream:
            lines = stream.iter_lines()
            next(lines)  # generating now: the worker is busy with this one
            answers = []
            waiters = [threading.Thread(target=lambda: answers.append(daemon.uds().post(
                "/v1/chat/completions", json=chat_body("p1", "queued", max_tokens=4)))) for _ in range(2)]
            for thread in waiters:
                thread.start()
            deadline = time.monotonic() + 60
            while watcher.get("/api/ps").json()["scheduler"]["queued"] < 2:
                assert time.monotonic() < deadline, "the two requests never queued"
                time.sleep(0.05)
            full = watcher.post("/v1/chat/completions", json=chat_body("p1", "one too many", max_tokens=4))
            assert full.status_code == 503 and full.headers["retry-after"] == "1"
            assert full.json()["error"]["code"] == "queue_full"
        # leaving the endless stream cancels it, which frees the worker for the queued two
        for thread in waiters:
            thread.join(120)
        assert [a.status_code for a in answers] == [200, 200]
        stats = wait_until_idle(watcher)
    assert stats["cancelled"] == 1 and stats["rejected"] == 1 and stats["completed"] == 2


def test_non_streamed_request_is_cancelled_when_its_client_leaves(fresh_daemon):
    import socket

    daemon = fresh_daemon()
    with daemon.uds() as watcher:
        # A raw connection we can hang up on at a known moment: once the request is running.
        body = json.dumps(chat_body("forever", "x", max_tokens=65536)).encode()
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.connect(str(daemon.socket))
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 60
        while watcher.get("/api/ps").json()["scheduler"]["running"] < 1:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.05)
        raw.close()  # the client leaves mid-generation
        stats = wait_until_idle(watcher)  # a generation of 65536 tokens would keep it busy for minutes
    assert stats["cancelled"] == 1 and stats["completed"] == 0


def wait_until_idle(client: httpx.Client, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while (stats := client.get("/api/ps").json()["scheduler"])["running"] or stats["queued"]:
        assert time.monotonic() < deadline, f"the scheduler is still busy: {stats}"
        time.sleep(0.05)
    return stats
