"""A client that hangs up mid-request must abort its engine request (and nothing else)."""

from __future__ import annotations

import json
import logging
import socket
import time

from tests.support.fake_engine import text_events

MANY_SLOW_EVENTS = text_events(*[f"tok{i} " for i in range(400)])


def open_request(server, body: dict) -> socket.socket:
    payload = json.dumps(body).encode()
    sock = socket.create_connection((server.host, server.port), timeout=10)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n")
    sock.sendall(head.encode() + payload)
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    received = b""
    while marker not in received:
        data = sock.recv(4096)
        assert data, f"connection closed before {marker!r}; got {received!r}"
        received += data
    return received


def wait_for(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def no_warnings_logged(caplog) -> bool:
    return not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_disconnect_mid_stream_aborts_the_request(server, engine, caplog):
    caplog.set_level(logging.DEBUG)
    engine.script(MANY_SLOW_EVENTS, delay=0.02)
    sock = open_request(server, {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                                 "stream": True})
    received = read_until(sock, b'"content":"tok1 "')
    assert b"text/event-stream" in received
    sock.close()
    assert wait_for(lambda: len(engine.submitted) == 1 and engine.aborted == [engine.submitted[0].id])
    assert engine.streams[0].aborted
    time.sleep(0.1)
    assert no_warnings_logged(caplog), [r.getMessage() for r in caplog.records]


def test_disconnect_while_waiting_for_a_non_streaming_answer_aborts(server, engine, caplog):
    engine.script(MANY_SLOW_EVENTS, delay=0.02)
    sock = open_request(server, {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
    assert wait_for(lambda: len(engine.streams) == 1)
    time.sleep(0.1)
    sock.close()
    assert wait_for(lambda: engine.aborted == [engine.submitted[0].id])
    time.sleep(0.1)
    assert no_warnings_logged(caplog), [r.getMessage() for r in caplog.records]


def test_completed_requests_are_not_aborted(server, engine):
    sock = open_request(server, {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                                 "stream": True})
    read_until(sock, b"data: [DONE]")
    sock.close()
    time.sleep(0.1)
    assert engine.aborted == []


def test_headers_and_first_frame_leave_together(server, engine):
    # a client's first read must already show the stream started (no header-only packet)
    engine.script(MANY_SLOW_EVENTS, delay=0.5)
    sock = open_request(server, {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                                 "stream": True})
    first = sock.recv(65536)
    sock.close()
    assert first.startswith(b"HTTP/1.1 200") and b"\r\n\r\n" in first
    assert b'data: {"id":"chatcmpl-' in first
