"""llama.cpp RPC for the RPC tests: the build .ci/llama-rpc made for this llama-cpp-python, and rpc-servers.

    build = llama_rpc_build()              # $ZLLM_TEST_CACHE/llama-rpc-r1-<version>-<libggml-base hash>; skips
    with rpc_servers(2) as endpoints:      # ["127.0.0.1:PORT", ...], 1 thread each, stopped after
        ...

The build directory is named as .ci/llama-rpc names it, so a llama-cpp-python rebuilt since (another
libggml-base) finds no build and skips, saying how to make one.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.daemon import _die_with_parent, free_port


def llama_rpc_build() -> Path:
    import llama_cpp

    base = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so.0"
    digest = hashlib.sha256(base.read_bytes()).hexdigest()[:12]
    # named as .ci/llama-rpc names it (r1: its RECIPE)
    build = Path(os.environ["ZLLM_TEST_CACHE"]) / f"llama-rpc-r1-{llama_cpp.__version__}-{digest}"
    if not (build / "llama-rpc.json").is_file():
        pytest.skip(f"no llama.cpp RPC build at {build}: run .ci/llama-rpc (ggml's RPC backend and rpc-server "
                    "for this llama-cpp-python, ~1 min)")
    return build


@contextmanager
def rpc_servers(count: int, build: Path) -> Iterator[list[str]]:
    procs, endpoints = [], []
    try:
        for _ in range(count):
            port = free_port()
            command = [str(build / "ggml-rpc-server"), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"]
            procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          preexec_fn=_die_with_parent))
            endpoints.append(f"127.0.0.1:{port}")
        for endpoint, proc in zip(endpoints, procs):
            _wait_listening(endpoint, proc)
        yield endpoints
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _wait_listening(endpoint: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Until the port takes connections. A bare connect and close: rpc-server then waits for its next client."""
    host, _, port = endpoint.rpartition(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rpc-server on {endpoint} exited with {proc.returncode}")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"rpc-server on {endpoint} not listening after {timeout} s")
