"""A real `ControlServer` on a real unix socket, served by an event loop on a background thread."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from zllm.control.server import ControlServer


class LoopThread:
    """An asyncio loop on its own thread; `run(coro)` waits for the result from the test's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args):
        """Run a plain function on the loop thread (what must only happen there: hub publishing, state)."""
        async def invoke():
            return fn(*args)
        return self.run(invoke())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@pytest.fixture()
def short_dir() -> Iterator[Path]:
    """tmp_path can exceed the 107-byte unix socket limit; this one cannot."""
    path = Path(tempfile.mkdtemp(prefix="zc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.stop()


@pytest.fixture()
def serve(loop_thread: LoopThread, short_dir: Path):
    """`serve(methods, streams) -> (server, socket path)`; closed at teardown."""
    servers: list[ControlServer] = []

    def start(methods: dict, streams: dict | None = None, version: str = "9.9.9"):
        server = ControlServer(short_dir / "run" / "zllm.sock", version=version, methods=methods, streams=streams)
        loop_thread.run(server.start())
        servers.append(server)
        return server, server.path

    yield start
    for server in servers:
        loop_thread.run(server.close())
