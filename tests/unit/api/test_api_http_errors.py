"""Every error path over HTTP, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import openai
import pytest

from tests.support.http_client import post_raw
from zllm.errors import ContextLengthExceeded, Overloaded

USER = [{"role": "user", "content": "hi"}]


def error_of(caught: pytest.ExceptionInfo) -> dict:
    return caught.value.body  # the SDK keeps the "error" object as `body`


def test_bad_json_body(server):
    status, body = post_raw(server.url, "/v1/chat/completions", b"{nope")
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in body["error"]["message"]
    assert set(body["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("body", "param"),
    [({"messages": USER}, "model"), ({"model": "fake-model"}, "messages"),
     ({"model": "fake-model", "messages": []}, "messages")],
)
def test_missing_fields_name_the_param(server, body, param):
    status, answer = post_raw(server.url, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 400
    assert (answer["error"]["type"], answer["error"]["param"], answer["error"]["code"]) == (
        "invalid_request_error", param, None)


def test_unknown_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=USER)
    assert error_of(caught)["code"] == "model_not_found"
    assert "no-such-model" in error_of(caught)["message"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_prompt_too_long_is_400_context_length_exceeded(client, engine):
    engine.prompt_tokens = 9000
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="fake-model", messages=USER, stream=True)
    error = error_of(caught)
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "context_length_exceeded",
                                                              "messages")
    assert error["message"] == "prompt is too long: 9000 tokens > 8192 maximum"


def test_n_greater_than_one_is_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="fake-model", messages=USER, n=2)
    assert error_of(caught)["param"] == "n"


def test_image_content_is_400_not_supported(client):
    content = [{"type": "text", "text": "what is this"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": content}])


def test_overloaded_is_503(client, engine):
    engine.fail_next(Overloaded("the queue is full"))
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="fake-model", messages=USER)
    assert caught.value.status_code == 503
    assert error_of(caught)["code"] == "overloaded"


def test_unexpected_exception_is_500_without_details(client, engine, caplog):
    engine.fail_next(RuntimeError("secret internal detail"))
    with caplog.at_level(logging.ERROR, logger="zllm.api"), pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="fake-model", messages=USER)
    assert caught.value.status_code == 500
    assert "secret" not in json.dumps(error_of(caught))
    assert error_of(caught)["type"] == "server_error"
    assert any("secret internal detail" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


def test_unknown_route_and_wrong_method_are_json_errors(server):
    status, body = post_raw(server.url, "/v1/nothing-here", b"{}")
    assert (status, body["error"]["code"]) == (404, "not_found")
    status, body = post_raw(server.url, "/v1/models", b"{}")
    assert status == 405 and body["error"]["type"] == "invalid_request_error"


def test_body_over_the_limit_is_413(serve, engine):
    server = serve(engine, max_body_bytes=1024)
    status, body = post_raw(server.url, "/v1/chat/completions", b'{"pad": "' + b"x" * 4096 + b'"}')
    assert (status, body["error"]["code"]) == (413, "request_too_large")


# ------------------------------------------------------------------------------------------------- auth


@pytest.fixture
def keyed_server(serve, engine):
    return serve(engine, api_key="secret-key")


def test_right_key_as_bearer_is_accepted(keyed_server, engine, make_client):
    make_client(keyed_server, api_key="secret-key").chat.completions.create(model="fake-model", messages=USER)
    assert len(engine.submitted) == 1


def test_right_key_as_x_api_key_is_accepted(keyed_server):
    body = json.dumps({"model": "fake-model", "messages": USER}).encode()
    status, answer = post_raw(keyed_server.url, "/v1/chat/completions", body, {"x-api-key": "secret-key"})
    assert status == 200 and answer["choices"][0]["message"]["content"] == "Hello world"


def test_wrong_key_is_401(keyed_server, engine, make_client):
    with pytest.raises(openai.AuthenticationError) as caught:
        make_client(keyed_server, api_key="wrong").chat.completions.create(model="fake-model", messages=USER)
    assert error_of(caught)["code"] == "invalid_api_key"
    assert engine.submitted == []


def test_missing_key_is_401(keyed_server):
    status, body = post_raw(keyed_server.url, "/v1/chat/completions", b"{}")
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key" and "missing API key" in body["error"]["message"]
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{keyed_server.url}/v1/models", timeout=10)
    assert caught.value.code == 401


def test_namespaces_differ_per_key(server, engine, make_client):
    make_client(server, api_key="alice").chat.completions.create(model="fake-model", messages=USER)
    make_client(server, api_key="bob").chat.completions.create(model="fake-model", messages=USER)
    post_raw(server.url, "/v1/chat/completions", json.dumps({"model": "fake-model", "messages": USER}).encode())
    alice, bob, anonymous = (r.namespace for r in engine.submitted)
    assert alice != bob and alice and bob
    assert anonymous == ""
    assert "alice" not in alice


def test_context_length_error_class_message_matches_what_clients_parse():
    assert ContextLengthExceeded(12429, 8192).message == "prompt is too long: 12429 tokens > 8192 maximum"
