"""Only its own clients (api/guard.py): a foreign Host, a foreign browser Origin or a body that is not JSON is
refused in the route's own error shape before the engine sees anything; SDKs, CLIs and probes pass."""

from __future__ import annotations

import asyncio
import http.client
import json

import aiohttp
import pytest

from zllm.api.guard import host_name, is_json_type

CHAT = ("/v1/chat/completions", {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
MESSAGES = ("/v1/messages", {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
RESPONSES = ("/v1/responses", {"model": "fake-model", "input": "hi"})
JSON = {"Content-Type": "application/json"}


def send(server, method: str, path: str, headers: dict, body: bytes | None = None) -> tuple[int, dict, dict]:
    """A raw request: http.client adds no Content-Type of its own, and sends the Host we give it."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body or b"")))
        connection.endheaders(body)
        response = connection.getresponse()
        raw = response.read()
        return response.status, dict(response.getheaders()), json.loads(raw) if raw else {}
    finally:
        connection.close()


def post(server, route=CHAT, headers: dict | None = None, body: bytes | None = None):
    path, payload = route
    data = json.dumps(payload).encode() if body is None else body
    return send(server, "POST", path, {**JSON, **(headers or {})}, data)


def test_the_rebinding_attack_from_the_issue_is_refused(server, engine) -> None:
    port = server.port
    status, _, body = post(server, headers={"Host": f"attacker.example:{port}", "Origin": "http://attacker.example",
                                            "Content-Type": "text/plain"})
    assert status == 403 and body["error"]["code"] == "forbidden_host"
    assert engine.submitted == []


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:11435", "127.0.0.1.nip.io",
                                  "localhost.evil.com"])
def test_a_foreign_host_is_403_in_each_apis_shape(server, engine, host) -> None:
    status, _, body = post(server, headers={"Host": host})
    assert (status, body["error"]["code"], body["error"]["type"]) == (403, "forbidden_host", "invalid_request_error")
    status, _, body = post(server, MESSAGES, headers={"Host": host})
    assert (status, body["type"], body["error"]["type"]) == (403, "error", "permission_error")
    status, _, body = post(server, RESPONSES, headers={"Host": host})
    assert status == 403 and body["error"]["code"] == "forbidden_host"
    assert engine.submitted == []


@pytest.mark.parametrize("host", ["localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "LOCALHOST.", "app.localhost",
                                  "192.168.1.20:{port}", "zllm.lan"])
def test_served_names_and_ip_literals_pass(serve, engine, host) -> None:
    server = serve(engine, allowed_hosts=("zllm.lan",))
    assert post(server, headers={"Host": host.format(port=server.port)})[0] == 200


def test_allowed_hosts_star_serves_any_name(serve, engine) -> None:
    server = serve(engine, allowed_hosts=("*",))
    assert post(server, headers={"Host": "anything.example"})[0] == 200


def test_a_browser_origin_is_refused_unless_allowed(serve, engine) -> None:
    closed = serve(engine)
    status, _, body = post(closed, headers={"Origin": "http://localhost:3000"})
    assert (status, body["error"]["code"]) == (403, "forbidden_origin")
    status, _, body = post(closed, MESSAGES, headers={"Origin": "null"})
    assert (status, body["error"]["type"]) == (403, "permission_error")
    opened = serve(engine, allowed_origins=("http://localhost:3000",))
    status, headers, _ = post(opened, headers={"Origin": "http://localhost:3000"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    assert post(opened, headers={"Origin": "http://localhost:3001"})[0] == 403
    assert post(serve(engine, allowed_origins=("*",)), headers={"Origin": "https://x.example"})[0] == 200


def test_a_streamed_answer_to_an_allowed_origin_carries_cors_headers(serve, engine) -> None:
    server = serve(engine, allowed_origins=("http://localhost:3000",))
    body = json.dumps({**CHAT[1], "stream": True}).encode()
    status, headers, _ = _stream(server, body)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://localhost:3000"


def _stream(server, body: bytes):
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        connection.request("POST", CHAT[0], body, {**JSON, "Origin": "http://localhost:3000"})
        response = connection.getresponse()
        response.read()
        return response.status, dict(response.getheaders()), {}
    finally:
        connection.close()


def test_preflight_is_answered_for_an_allowed_origin_only(serve, engine) -> None:
    server = serve(engine, allowed_origins=("http://localhost:3000",))
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
    status, headers, _ = send(server, "OPTIONS", CHAT[0], {"Origin": "http://localhost:3000", **ask})
    assert status == 204 and headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    assert headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    assert send(server, "OPTIONS", CHAT[0], {"Origin": "http://evil.example", **ask})[0] == 403


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml",
                                          "multipart/form-data; boundary=x", None])
def test_a_body_that_is_not_json_is_415(server, engine, content_type) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    path, payload = CHAT
    status, _, body = send(server, "POST", path, headers, json.dumps(payload).encode())
    assert (status, body["error"]["code"]) == (415, "unsupported_media_type")
    status, _, body = send(server, "POST", MESSAGES[0], headers, json.dumps(MESSAGES[1]).encode())
    assert (status, body["type"], body["error"]["type"]) == (415, "error", "invalid_request_error")
    assert engine.submitted == []


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", None])
def test_the_ollama_api_takes_curl_d_unless_a_browser_sent_it(serve, engine, content_type) -> None:
    server = serve(engine, allowed_origins=["http://localhost:3000"])
    headers = {"Content-Type": content_type} if content_type else {}
    generate = json.dumps({"model": "fake-model", "prompt": "", "stream": False}).encode()
    assert send(server, "POST", "/api/generate", headers, generate)[0] == 200  # as Ollama's docs call it
    browser = {**headers, "Origin": "http://localhost:3000"}  # an allowed page: still no simple-request body
    assert send(server, "POST", "/api/generate", browser, generate)[0] == 415
    assert send(server, "POST", CHAT[0], headers, json.dumps(CHAT[1]).encode())[0] == 415  # only /api/


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON",
                                          "application/vnd.x+json"])
def test_json_content_types_pass(server, content_type) -> None:
    assert post(server, headers={"Content-Type": content_type})[0] == 200


def test_health_stays_open_to_any_host_and_origin(server) -> None:
    assert send(server, "GET", "/health", {"Host": "probe.example", "Origin": "http://x.example"})[0] == 200


def test_a_websocket_from_a_web_page_is_refused_and_codex_is_served(server) -> None:
    """Browsers apply no CORS to WebSockets: the Origin check is the only thing between a page and the socket."""
    headers = {"Authorization": "Bearer test-key", "openai-beta": "responses_websockets=2026-02-06"}

    async def connect(extra: dict):
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(f"{server.url}/v1/responses", headers={**headers, **extra}) as ws:
                    await ws.send_json({"type": "response.create", "model": "fake-model", "input": "hi",
                                        "store": False})
                    while (await asyncio.wait_for(ws.receive_json(), 10))["type"] != "response.completed":
                        pass
                    return "served"
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    assert asyncio.run(connect({"Origin": "http://attacker.example"})) == 403
    assert asyncio.run(connect({})) == "served"


@pytest.mark.parametrize(("header", "name"), [("LocalHost:11435", "localhost"), ("[::1]:80", "::1"), ("::1", "::1"),
                                               ("example.com.", "example.com"), ("10.0.0.1", "10.0.0.1")])
def test_host_name_parsing(header, name) -> None:
    assert host_name(header) == name


def test_json_type_rule() -> None:
    assert is_json_type("application/json") and is_json_type("application/problem+json; charset=utf-8")
    assert not is_json_type("text/json-ish") and not is_json_type("") and not is_json_type("application/jsonx")
