"""Every error path of the Anthropic routes over HTTP, in Anthropic's shape:

    {"type": "error", "error": {"type": "invalid_request_error", "message": "…"}}
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import anthropic
import pytest

from tests.support.fake_engine import error_events
from tests.support.http_client import post_raw
from zllm.errors import ContextLengthExceeded, Overloaded

MODEL = "fake-model"
USER = [{"role": "user", "content": "hi"}]


def assert_anthropic_error(body: dict, error_type: str) -> str:
    assert body["type"] == "error" and set(body) == {"type", "error"}
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == error_type
    return body["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages?beta=true", "/v1/messages/count_tokens"])
def test_bad_json(server, path):
    status, body = post_raw(server.url, path, b"{nope")
    assert status == 400
    assert "not valid JSON" in assert_anthropic_error(body, "invalid_request_error")


@pytest.mark.parametrize(
    ("body", "words"),
    [({"model": MODEL, "messages": USER}, "`max_tokens`"),
     ({"model": MODEL, "max_tokens": 8}, "`messages`"),
     ({"max_tokens": 8, "messages": USER}, "`model`"),
     ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [
         {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
      "not supported")],
)
def test_invalid_requests(server, body, words):
    status, answer = post_raw(server.url, "/v1/messages", json.dumps(body).encode())
    assert status == 400
    assert words in assert_anthropic_error(answer, "invalid_request_error")


def test_count_tokens_needs_no_max_tokens_but_needs_messages(server):
    status, answer = post_raw(server.url, "/v1/messages/count_tokens", json.dumps({"model": MODEL}).encode())
    assert status == 400
    assert "`messages`" in assert_anthropic_error(answer, "invalid_request_error")


def test_unknown_model_is_404_not_found_error(claude):
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.create(model="no-such-model", max_tokens=8, messages=USER)
    assert "no-such-model" in assert_anthropic_error(caught.value.body, "not_found_error")
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.models.retrieve("no-such-model")
    assert_anthropic_error(caught.value.body, "not_found_error")


def test_prompt_too_long_has_the_message_claude_code_parses(claude, engine):
    engine.prompt_tokens = 12429
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as caught:
            claude.messages.create(model=MODEL, max_tokens=32000, messages=USER, stream=stream)
        message = assert_anthropic_error(caught.value.body, "invalid_request_error")
        assert message == "prompt is too long: 12429 tokens > 8192 maximum"


def test_engine_raising_context_length_directly(claude, engine):
    engine.fail_next(ContextLengthExceeded(9000, 8192))
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["message"] == "prompt is too long: 9000 tokens > 8192 maximum"


def test_overloaded_is_a_retryable_5xx(claude, engine):
    engine.fail_next(Overloaded("64 requests are already waiting"))
    with pytest.raises(anthropic.InternalServerError) as caught:
        claude.messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert caught.value.status_code == 503
    assert_anthropic_error(caught.value.body, "overloaded_error")


@pytest.mark.parametrize("headers", [{}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"}])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_bad_or_missing_key_is_401_authentication_error(serve, engine, headers, path):
    server = serve(engine, api_key="secret")
    body = json.dumps({"model": MODEL, "max_tokens": 8, "messages": USER}).encode()
    status, answer = post_raw(server.url, path, body, headers)
    assert status == 401
    assert "API key" in assert_anthropic_error(answer, "authentication_error")


def test_sdk_with_a_bad_key(serve, engine, make_anthropic):
    server = serve(engine, api_key="secret")
    with pytest.raises(anthropic.AuthenticationError) as caught:
        make_anthropic(server, api_key="wrong").messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert_anthropic_error(caught.value.body, "authentication_error")
    with pytest.raises(anthropic.AuthenticationError):
        make_anthropic(server, api_key="wrong").models.list()
    assert [m.id for m in make_anthropic(server, api_key="secret").models.list().data] == [MODEL]


def test_models_401_without_anthropic_version_stays_openai_shaped(serve, engine):
    server = serve(engine, api_key="secret")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{server.url}/v1/models", timeout=10)
    assert caught.value.code == 401
    assert json.load(caught.value)["error"]["type"] == "invalid_request_error"


def test_engine_error_mid_stream_is_an_error_event(claude, engine):
    engine.script(error_events("partial ", code="engine_error", message="CUDA out of memory"))
    texts = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        for event in claude.messages.create(model=MODEL, max_tokens=8, messages=USER, stream=True):
            if event.type == "content_block_delta":
                texts.append(event.delta.text)
    assert texts == ["partial "]
    assert "CUDA out of memory" in assert_anthropic_error(caught.value.body, "api_error")


def test_engine_error_without_stream_is_500_api_error(claude, engine):
    engine.script(error_events(code="engine_error", message="CUDA out of memory"))
    with pytest.raises(anthropic.InternalServerError) as caught:
        claude.messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert caught.value.status_code == 500
    assert assert_anthropic_error(caught.value.body, "api_error") == "CUDA out of memory"
