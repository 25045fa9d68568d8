"""The control protocol end to end over a real unix socket: ControlServer ⇄ ControlClient (and raw bytes)."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
import threading

import pytest

from zllm.control.client import ControlClient
from zllm.control.protocol import ControlError, DaemonUnreachable
from zllm.errors import ConfigError, InvalidRequest


async def echo(params: dict) -> dict:
    return {"echo": params}


async def refuse(params: dict) -> dict:
    raise InvalidRequest("bad things", hint="do good things")


async def crash(params: dict) -> dict:
    raise RuntimeError("boom")


def raw_exchange(path, *lines: bytes) -> list[dict]:
    """Send raw lines on one connection; read one reply per line."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        reader = sock.makefile("rb")
        replies = []
        for line in lines:
            sock.sendall(line)
            replies.append(json.loads(reader.readline()))
        return replies


def test_a_call_round_trips_and_reports_the_daemon_version(serve) -> None:
    _, path = serve({"echo": echo}, version="1.2.3")
    seen: list[str] = []
    client = ControlClient(path, on_version=seen.append)
    assert client.call("echo", a=1, b=None) == {"echo": {"a": 1}}  # None params are not sent
    assert client.server_version == "1.2.3" and seen == ["1.2.3"]


def test_socket_is_private_to_the_user(serve) -> None:
    _, path = serve({"echo": echo})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_errors_carry_code_message_and_hint(serve) -> None:
    _, path = serve({"refuse": refuse, "crash": crash, "echo": echo})
    client = ControlClient(path)
    with pytest.raises(ControlError) as refused:
        client.call("refuse")
    assert (refused.value.code, refused.value.message, refused.value.hint) == (
        "invalid_request", "bad things", "do good things")
    with pytest.raises(ControlError) as crashed:
        client.call("crash")
    assert crashed.value.code == "internal_error" and "RuntimeError: boom" in crashed.value.message
    with pytest.raises(ControlError) as unknown:
        client.call("nope")
    assert unknown.value.code == "unknown_method" and "echo" in unknown.value.hint
    assert client.call("echo") == {"echo": {}}  # the server survives all of it


def test_protocol_version_and_malformed_lines_are_answered_on_a_live_connection(serve) -> None:
    _, path = serve({"echo": echo})
    future, garbage, fine = raw_exchange(
        path,
        b'{"v": 2, "id": 7, "method": "echo", "params": {}}\n',
        b"not json\n",
        b'{"v": 1, "id": 8, "method": "echo", "params": {"x": 1}}\n',
    )
    assert future["id"] == 7 and future["error"]["code"] == "protocol_version"
    assert garbage["id"] is None and garbage["error"]["code"] == "bad_request"
    assert fine == {"v": 1, "id": 8, "zllm": "9.9.9", "result": {"echo": {"x": 1}}}


def test_a_stream_sends_items_then_an_end_marker(serve) -> None:
    async def count(params: dict):
        for i in range(params["n"]):
            yield {"i": i}

    _, path = serve({}, {"count": count})
    assert list(ControlClient(path).stream("count", n=3)) == [{"i": 0}, {"i": 1}, {"i": 2}]
    replies = raw_exchange(path, b'{"v": 1, "id": 1, "method": "count", "params": {"n": 0}}\n')
    assert replies == [{"v": 1, "id": 1, "zllm": "9.9.9", "end": {"reason": "done"}}]


def test_a_client_hanging_up_stops_a_follow_on_the_server(serve, loop_thread) -> None:
    stopped = threading.Event()
    ticks = asyncio.Queue()

    async def follow(params: dict):
        try:
            while True:
                yield await ticks.get()
        finally:
            stopped.set()

    _, path = serve({}, {"follow": follow})
    loop_thread.call(ticks.put_nowait, {"tick": 1})
    stream = ControlClient(path).stream("follow")
    assert next(stream) == {"tick": 1}
    stream.close()  # the CLI's Ctrl-C: the generator's finally closes the connection
    assert stopped.wait(5)


def test_closing_the_server_ends_followers_with_shutdown_and_removes_the_socket(serve, loop_thread) -> None:
    async def forever(params: dict):
        yield {"hello": True}
        await asyncio.Event().wait()

    server, path = serve({}, {"forever": forever})
    stream = ControlClient(path).stream("forever")
    assert next(stream) == {"hello": True}
    loop_thread.run(server.close())
    assert list(stream) == []  # the end marker (reason "shutdown") ends the iteration cleanly
    assert not path.exists()


def test_nothing_listening_is_daemon_unreachable(short_dir) -> None:
    with pytest.raises(DaemonUnreachable) as missing:
        ControlClient(short_dir / "zllm.sock").status()
    assert missing.value.hint == "start one: zllm start"
    stale = short_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX) as sock:  # bound, then closed: the file a kill -9 leaves
        sock.bind(str(stale))
    with pytest.raises(DaemonUnreachable):
        ControlClient(stale).status()


def test_a_daemon_that_does_not_answer_times_out(short_dir) -> None:
    path = short_dir / "mute.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        sock.listen()
        with pytest.raises(DaemonUnreachable) as mute:
            ControlClient(path, timeout=0.2).status()
    assert "did not answer" in mute.value.message


def test_a_socket_path_beyond_the_unix_limit_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError) as too_long:
        ControlClient(tmp_path / ("x" * 120) / "zllm.sock").status()
    assert "ZLLM_RUNTIME_DIR" in too_long.value.hint
