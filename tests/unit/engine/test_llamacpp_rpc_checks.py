"""`--rpc`'s checks before anything is registered with ggml (registration is for good, and ggml aborts the process
on a server it cannot talk to): endpoints, llama.cpp's RPC handshake against real sockets that are not a
working rpc-server, and the RPC backend module's build record. Nothing here loads an RPC backend into the test
process; tests/integration/test_llamacpp_rpc.py runs real rpc-servers."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytest.importorskip("llama_cpp")

from zllm.engine.llamacpp import rpc  # noqa: E402
from zllm.errors import ConfigError  # noqa: E402


@pytest.mark.parametrize("raw", ["localhost", "host:", ":50052", "host:port", "host:70000", "[::1]:50052"])
def test_endpoints_are_host_colon_port(raw: str) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        rpc.parse_endpoints([raw])


def test_endpoints_are_stripped_and_empties_dropped() -> None:
    assert rpc.parse_endpoints([" 10.0.0.2:50052", "", "gpu-box:50053 "]) == ("10.0.0.2:50052", "gpu-box:50053")


@contextmanager
def listener(answer: bytes | None) -> Iterator[str]:
    """A real TCP server on 127.0.0.1: reads a HELLO, then sends `answer` (None: never answers, like an
    rpc-server busy with another client, whose backlog takes the connection)."""
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        if answer is None:
            done.wait()
            return
        conn, _ = server.accept()
        with conn:
            conn.recv(1 + 8 + rpc.RPC_CONN_CAPS_SIZE)
            conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        server.close()
        thread.join(5)


def hello_answer(major: int, minor: int = 0, patch: int = 0, size: int = 4 + rpc.RPC_CONN_CAPS_SIZE) -> bytes:
    return struct.pack("<Q", size) + bytes([major, minor, patch, 0]) + bytes(rpc.RPC_CONN_CAPS_SIZE)


def test_handshake_reads_the_protocol_version() -> None:
    with listener(hello_answer(rpc.RPC_PROTO_MAJOR, 1, 2)) as endpoint:
        assert rpc.handshake(endpoint) == (rpc.RPC_PROTO_MAJOR, 1, 2)


def test_a_server_that_never_answers_times_out_with_the_reason() -> None:
    with listener(None) as endpoint, pytest.raises(ConfigError, match="did not answer .* in 0.3 s") as failure:
        rpc.handshake(endpoint, timeout=0.3)
    assert "one client at a time" in failure.value.hint


def test_nothing_listening_is_unreachable() -> None:
    with listener(None) as endpoint:
        pass  # closed: the port is free again
    with pytest.raises(ConfigError, match="cannot reach the RPC server"):
        rpc.handshake(endpoint)


def test_another_protocol_or_another_service_is_refused() -> None:
    with listener(hello_answer(rpc.RPC_PROTO_MAJOR - 1)) as endpoint, pytest.raises(ConfigError, match="speaks"):
        rpc.handshake(endpoint)
    with listener(b"HTTP/1.1 400 Bad Request\r\n\r\n") as endpoint, pytest.raises(ConfigError, match="like an rpc"):
        rpc.handshake(endpoint)


def built_in() -> bool:
    return bool(rpc._ggml().ggml_backend_reg_by_name(b"RPC"))


def test_without_the_rpc_backend_the_error_says_how_to_rebuild() -> None:
    if built_in():
        pytest.skip("this llama-cpp-python was built with the RPC backend")
    with pytest.raises(ConfigError, match="built without") as failure:
        rpc.register_rpc_servers(["127.0.0.1:50052"])
    assert 'CMAKE_ARGS="-DGGML_RPC=ON"' in failure.value.hint


def test_a_module_built_for_another_ggml_is_refused(tmp_path) -> None:
    if built_in():
        pytest.skip("this llama-cpp-python was built with the RPC backend")
    module = tmp_path / "libggml-rpc.so"
    module.write_bytes(b"never loaded")
    with pytest.raises(ConfigError, match="no such module"):
        rpc.register_rpc_servers(["127.0.0.1:50052"], backend_path=str(module))
    (tmp_path / rpc.BUILD_RECORD).write_text(json.dumps({"libggml_base_sha256": "0" * 64}))
    with pytest.raises(ConfigError, match="another libggml-base"):
        rpc.register_rpc_servers(["127.0.0.1:50052"], backend_path=str(module))


def test_rpc_is_for_gguf_on_llama_cpp(tmp_path) -> None:
    from zllm.engine.select import load_for_backend

    with pytest.raises(ConfigError, match="this model runs on torch"):  # no model.gguf: a safetensors model
        load_for_backend(tmp_path, rpc_servers=("127.0.0.1:50052",))


def test_load_log_collects_and_puts_the_previous_logger_back(tiny_gguf_path) -> None:
    import ctypes

    import llama_cpp as lc

    def current() -> int | None:
        callback, data = ctypes.c_void_p(), ctypes.c_void_p()
        rpc._function("llama_log_get", None, [ctypes.POINTER(ctypes.c_void_p)] * 2)(ctypes.byref(callback),
                                                                                     ctypes.byref(data))
        return callback.value

    before = current()
    with rpc.load_log() as lines:
        params = lc.llama_model_default_params()
        model = lc.llama_model_load_from_file(str(tiny_gguf_path("llama")).encode(), params)
        assert current() != before
    lc.llama_model_free(model)
    assert current() == before
    assert any("model buffer size" in line for line in lines)
    assert rpc.placement(lines).startswith("CPU")
