"""Chat Completions end to end: the official openai SDK against a real daemon on a real port."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time

import openai
import pytest

from tests.integration.conftest import CONTEXT, TINY
from tests.support.http_client import post_raw

HELLO = [{"role": "user", "content": "Say hello."}]


def greedy(client: openai.OpenAI, **kwargs):
    params = {"model": TINY, "messages": HELLO, "temperature": 0, "max_tokens": 16, **kwargs}
    return client.chat.completions.create(**params)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [TINY]


def test_non_streaming_answer_has_usage_and_cached_tokens(client: openai.OpenAI) -> None:
    completion = greedy(client)
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert completion.usage.completion_tokens == 16
    assert completion.usage.prompt_tokens > 5
    assert completion.usage.prompt_tokens_details.cached_tokens == 0


def test_streaming_equals_non_streaming_and_reports_usage(client: openai.OpenAI) -> None:
    whole = greedy(client).choices[0].message.content
    chunks = list(greedy(client, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    usage_chunks = [c for c in chunks if not c.choices]
    assert len(usage_chunks) == 1 and usage_chunks[0].usage.completion_tokens == 16


def test_stop_sequence_cuts_the_answer_before_it(client: openai.OpenAI) -> None:
    whole = greedy(client, max_tokens=24).choices[0].message.content
    stop = whole[len(whole) // 2 : len(whole) // 2 + 3]
    assert stop.strip(), f"need a visible stop string from {whole!r}"
    cut = greedy(client, max_tokens=24, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == whole[: whole.index(stop)]
    streamed = "".join(c.choices[0].delta.content or "" for c in greedy(client, max_tokens=24, stop=stop, stream=True) if c.choices)
    assert streamed == cut.message.content


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    one = greedy(client, temperature=1.0, seed=7).choices[0].message.content
    two = greedy(client, temperature=1.0, seed=7).choices[0].message.content
    assert one == two


def test_max_tokens_beyond_the_window_is_clamped_not_rejected(client: openai.OpenAI) -> None:
    completion = greedy(client, max_tokens=100_000)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.prompt_tokens + completion.usage.completion_tokens == CONTEXT


def test_prompt_longer_than_the_window_is_context_length_exceeded(client: openai.OpenAI) -> None:
    long = [{"role": "user", "content": "hello " * (CONTEXT * 2)}]
    with pytest.raises(openai.BadRequestError) as caught:
        greedy(client, messages=long)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["code"] == "context_length_exceeded"
    assert f"> {CONTEXT} maximum" in error["message"]


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        greedy(client, model="no-such-model")
    assert caught.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (json.dumps({"model": TINY}).encode(), "messages"),
        (json.dumps({"messages": HELLO}).encode(), "model"),
        (json.dumps({"model": TINY, "messages": []}).encode(), "messages"),
        (json.dumps({"model": TINY, "messages": HELLO, "max_tokens": -1}).encode(), "max_tokens"),
    ],
)
def test_malformed_requests_get_openai_errors(daemon, body: bytes, param: str | None) -> None:
    status, answer = post_raw(daemon.base_url, "/v1/chat/completions", body)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"]
    if param:
        assert answer["error"]["param"] == param


def test_concurrent_requests_all_complete(client: openai.OpenAI) -> None:
    expected = greedy(client).choices[0].message.content
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: greedy(client).choices[0].message.content, range(6)))
    assert results == [expected] * 6


def test_client_disconnect_aborts_the_request(daemon, client: openai.OpenAI) -> None:
    body = json.dumps({"model": TINY, "messages": HELLO, "stream": True, "max_tokens": 100_000, "temperature": 0})
    with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        received = b""
        while b"data:" not in received:  # the stream has started
            chunk = sock.recv(65536)
            assert chunk, "connection closed before the stream started"
            received += chunk
    deadline = time.monotonic() + 20
    while "abort" not in daemon.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "abort" in daemon.log()
    # the engine is free again: a new request completes
    assert greedy(client, max_tokens=4).usage.completion_tokens == 4
