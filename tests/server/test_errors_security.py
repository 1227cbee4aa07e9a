"""Bad requests get the right status and one error shape; only local, authenticated callers get in."""

from __future__ import annotations

import os
import stat

import pytest

from tests.server.harness import chat_body
from zenedge.api import discovery
from zenedge.errors import InvalidInput
from zenedge.server import security, settings


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"])
    assert "Traceback" not in response.text
    return body["error"]


@pytest.fixture(params=["unix", "tcp"])
def http(request, daemon):
    with (daemon.uds() if request.param == "unix" else daemon.tcp()) as client:
        yield client


def test_malformed_json_is_400(http):
    assert error_of(http.post("/v1/chat/completions", content=b'{"model": "p0", '), 400)["code"] == "invalid_json"
    # whatever the content type says: every endpoint takes JSON
    response = http.post("/api/rm", content=b"name=p0", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert error_of(response, 400)["code"] == "invalid_json"


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,                                     # valid JSON, nested too deep to parse
    b'{"model": "p0", "messages": [' + b'{"a": [' * 3000 + b"]}" * 3000 + b"]}",
    b'{"model": "p0", "messages": [{"role": "user", "content": "\xff\xfe"}]}',  # not UTF-8
])
def test_bodies_that_cannot_be_parsed_are_invalid_json(http, body):
    """Regression: these answered 400 with code "error" (FastAPI's own parse failure)."""
    error = error_of(http.post("/v1/chat/completions", content=body), 400)
    assert error["code"] == "invalid_json" and error["message"].startswith("malformed JSON body")


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", b'{"model": "p0", "messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("/v1/chat/completions", b'{"model": "p0", "messages": [{"role": "user", "content": [{"type": "text", '
                             b'"text": "a\\udfffb"}]}]}'),
    ("/v1/completions", b'{"model": "p0", "prompt": "hi", "stop": ["\\ud800"]}'),
])
def test_lone_surrogates_are_422_and_the_connection_lives_on(http, path, body):
    """Regression (found by tests/faults.py): an escaped lone surrogate reached the tokenizer, the
    request ended in a 500 and the server dropped the keep-alive connection."""
    error = error_of(http.post(path, content=body), 422)
    assert error["code"] == "invalid_request" and "surrogate" in error["message"]
    assert http.get("/health").status_code == 200  # same client, same connection


@pytest.mark.parametrize("body, where", [
    ({"model": "p0"}, "messages"),
    ({**chat_body("p0", "hi"), "temperature": 500}, "temperature"),
    ({**chat_body("p0", "hi"), "n": 9}, "n"),
    ({**chat_body("p0", "hi"), "max_tokens": 0}, "max_tokens"),
    ({"model": "p0", "messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({**chat_body("p0", "hi"), "stop": ["a"] * 17}, "stop"),
])
def test_schema_violations_are_422_in_the_common_shape(http, body, where):
    error = error_of(http.post("/v1/chat/completions", json=body), 422)
    assert error["code"] == "invalid_request" and where in error["message"]


def test_native_requests_are_strict(http):
    error = error_of(http.put("/api/budget", json={"size": "1GiB", "dry_run": True, "typo": 1}), 422)
    assert "typo" in error["message"]


@pytest.mark.parametrize("model", ["ghost", "GPT-4 (turbo)", "../etc"])
def test_unknown_model_is_404(http, model):
    assert error_of(http.post("/v1/chat/completions", json=chat_body(model, "hi")), 404)["code"] == "adapter_not_found"
    assert error_of(http.post("/v1/completions", json={"model": model, "prompt": "x"}), 404)


def test_unknown_endpoint_and_method(http):
    assert error_of(http.get("/v2/nothing"), 404)["code"] == "not_found"
    assert error_of(http.get("/v1/chat/completions"), 405)["code"] == "method_not_allowed"


def test_huge_bodies_are_413(http):
    huge = chat_body("p0", "x" * (2 << 20))
    assert error_of(http.post("/v1/chat/completions", json=huge), 413)["code"] == "payload_too_large"

    def chunks():  # no Content-Length: the limit holds on the bytes actually sent
        for _ in range(40):
            yield b"x" * 65536

    assert error_of(http.post("/api/rm", content=chunks()), 413)["code"] == "payload_too_large"
    assert http.get("/health").status_code == 200  # and the daemon is fine


def test_tcp_needs_the_token_except_for_health(daemon):
    with daemon.tcp(token=None) as anonymous, daemon.tcp(token="wrong") as wrong:
        assert anonymous.get("/health").status_code == 200
        for client in (anonymous, wrong):
            response = client.post("/v1/chat/completions", json=chat_body("p0", "hi"))
            assert error_of(response, 401)["code"] == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
            assert error_of(client.get("/api/ps"), 401)
    with daemon.uds() as local:  # the socket itself is the credential
        assert local.get("/api/ps").status_code == 200


# What a web page's requests to the daemon look like: a CORS fetch (its Origin), DNS rebinding (its
# Host), an <img> or a no-cors fetch (no Origin, but the browser's Sec-Fetch-Site).
PAGE_HEADERS = ({"Origin": "https://evil.example"}, {"Origin": "null"}, {"Host": "evil.example:11435"},
                {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"})


@pytest.mark.parametrize("headers", PAGE_HEADERS)
def test_a_page_is_refused_even_with_the_token(daemon, headers):
    with daemon.tcp() as client:
        assert error_of(client.get("/api/tags", headers=headers), 403)["code"] == "forbidden"
        assert error_of(client.post("/v1/chat/completions", json=chat_body("p0", "hi"), headers=headers), 403)
        assert client.get("/api/tags", headers={"Sec-Fetch-Site": "none"}).status_code == 200   # typed in the bar


def test_loopback_mode_needs_no_token_from_this_machine_and_still_refuses_pages(fresh_daemon):
    running = fresh_daemon(config={"server": {"tcp_auth": "loopback"}})
    with running.tcp(token=None) as anonymous, running.tcp(token="ollama") as placeholder:
        for client in (anonymous, placeholder):   # what Ollama clients send: nothing, or a dummy key
            assert client.get("/api/tags").status_code == 200
            answer = client.post("/v1/chat/completions", json=chat_body("p0", "hi", max_tokens=3))
            assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] is not None
        for headers in PAGE_HEADERS:
            assert error_of(anonymous.get("/api/tags", headers=headers), 403)["code"] == "forbidden"
            assert error_of(anonymous.post("/v1/chat/completions", json=chat_body("p0", "hi"), headers=headers), 403)


def test_loopback_mode_trusts_only_loopback_addresses():
    import anyio
    import httpx

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"in"})

    async def status(client_address: str, trusted: bool, token: str | None = None) -> int:
        guarded = security.TokenAuth(app, token="secret", loopback_is_trusted=lambda: trusted)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.ASGITransport(guarded, client=(client_address, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost:11435") as client:   # a port: TCP
            return (await client.get("/api/tags", headers=headers)).status_code

    for address in ("127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1"):
        assert anyio.run(status, address, True) == 200
        assert anyio.run(status, address, False) == 401             # the default, "token"
    for address in ("10.0.0.5", "192.168.1.20", "fe80::1", "::ffff:10.0.0.5", "not-an-address"):
        assert anyio.run(status, address, True) == 401              # off this machine: the token, always
        assert anyio.run(status, address, True, "secret") == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:11435", "127.0.0.1.evil.example", "0.0.0.0", "",
                                  "localhost@evil.example"])
def test_foreign_host_is_403_on_both_listeners(daemon, host):
    for client in (daemon.uds(), daemon.tcp()):
        with client:
            for path in ("/health", "/v1/models"):
                assert error_of(client.get(path, headers={"Host": host}), 403)["code"] == "forbidden"


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:8080", "127.0.0.1:11435", "[::1]", "[::1]:1"])
def test_local_hosts_are_accepted(daemon, host):
    with daemon.tcp() as client:
        assert client.get("/v1/models", headers={"Host": host}).status_code == 200


def test_cors_only_for_configured_origins(daemon):
    with daemon.tcp() as client:
        allowed = client.get("/v1/models", headers={"Origin": "tauri://localhost"})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "tauri://localhost"
        assert error_of(client.get("/v1/models", headers={"Origin": "https://evil.example"}), 403)
    with daemon.tcp(token=None) as anonymous:  # a preflight carries no token
        preflight = anonymous.options("/v1/chat/completions", headers={
            "Origin": "http://tauri.localhost", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 204
        assert "Authorization" in preflight.headers["access-control-allow-headers"]
        assert preflight.headers["access-control-allow-origin"] == "http://tauri.localhost"


def test_socket_is_private(daemon):
    assert stat.S_IMODE(daemon.socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(daemon.socket.parent.stat().st_mode) == 0o700


def test_host_check_rules():
    assert security.host_allowed("localhost:1")
    assert not security.host_allowed(None)
    assert not security.host_allowed("10.0.0.5:11435")
    assert security.host_allowed("10.0.0.5:11435", extra={"10.0.0.5"})


def test_long_socket_paths_fall_back_to_a_short_private_one(tmp_path):
    deep = tmp_path / ("d" * 120)
    choice = discovery.choose_socket("", deep, tmp_path / "home")
    assert choice.path.parent == discovery.Path("/tmp") / f"zenedge-{os.getuid()}"
    assert len(os.fsencode(str(choice.path))) <= discovery.SUN_PATH_MAX
    assert "over the" in choice.note and str(deep) in choice.note
    # both sides derive the same path from the home; another home gets another one
    assert discovery.choose_socket("", deep, tmp_path / "home") == choice
    assert discovery.choose_socket("", deep, tmp_path / "other").path != choice.path
    assert discovery.choose_socket("", tmp_path, tmp_path).note is None


def test_token_file_is_created_once_0600_and_env_wins(tmp_path, monkeypatch):
    token, where = settings.load_or_create_token(tmp_path)
    assert len(token) >= 32 and where == str(tmp_path / "token")
    assert stat.S_IMODE((tmp_path / "token").stat().st_mode) == 0o600
    assert settings.load_or_create_token(tmp_path)[0] == token
    monkeypatch.setenv("ZENEDGE_TOKEN", "from-env")
    assert settings.load_or_create_token(tmp_path) == ("from-env", "ZENEDGE_TOKEN")


def test_non_loopback_tcp_needs_allow_remote():
    from zenedge import config

    cfg = config.load()
    with pytest.raises(InvalidInput, match="--allow-remote"):
        settings.resolve(cfg, tcp="0.0.0.0:11435")
    remote = settings.resolve(cfg, tcp="0.0.0.0:11435", allow_remote=True)
    assert remote.tcp == ("0.0.0.0", 11435) and remote.token  # the token is always required
    assert settings.resolve(cfg, tcp="[::1]:0").tcp == ("::1", 0)
    with pytest.raises(InvalidInput):
        settings.parse_tcp("localhost")


def test_native_routes_without_fields_refuse_bodies_they_do_not_understand(daemon):
    with daemon.uds() as http:
        assert http.post("/api/pool", json={"action": "nuke"}).status_code == 422
        assert http.post("/api/stop", content=b"{{", headers={"content-type": "application/json"}).status_code == 400
        assert http.post("/api/stop", json={"now": True}).status_code == 422
        assert http.get("/health").status_code == 200          # none of them stopped it
