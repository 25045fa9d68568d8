"""Run a zllm aiohttp app on a real 127.0.0.1 port in a background thread (its own event loop).

    with ThreadedServer(create_app(engine)) as server:
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="k")...

Synchronous clients (the openai SDK, sockets) then talk to it exactly as they would to the daemon.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

from aiohttp import web

from zllm.api.app import bound_port, start_site


class ThreadedServer:
    def __init__(self, app: web.Application, *, host: str = "127.0.0.1"):
        self.app = app
        self.host = host
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="zllm-test-server", daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ThreadedServer:
        self._thread.start()
        self._runner = self.call(start_site(self.app, self.host, 0, shutdown_timeout=1.0))
        self.port = bound_port(self._runner)
        return self

    def call(self, coro, timeout: float = 10.0):
        """Run `coro` on the server's loop and wait for its result."""
        future: Future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def stop(self) -> None:
        if self._runner is not None:
            self.call(self._runner.cleanup())
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
