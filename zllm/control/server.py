"""The daemon's side of the control socket: an asyncio unix-socket server speaking protocol.py.

    server = ControlServer(path, version="0.1.0", methods={"status": status}, streams={"trace": trace})
    await server.start()        # binds path (mode 0600, in a 0700 directory); replaces no live socket
    ...
    await server.close()        # followers get {"end": {"reason": "shutdown"}}; the socket file is removed

`methods[name](params) -> awaitable JSON result`; `streams[name](params) -> async iterator of JSON items`.
A `ZllmError` becomes an error reply with its code and hint; any other exception is logged with its
traceback and answered as `internal_error` (a bug must not take the daemon down, nor leave a client hanging).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from zllm.control.client import check_socket_path
from zllm.control.protocol import (
    BAD_REQUEST,
    INTERNAL,
    MAX_LINE_BYTES,
    PROTOCOL_MISMATCH,
    PROTOCOL_VERSION,
    UNKNOWN_METHOD,
    decode,
    encode,
    error_body,
    reply,
)
from zllm.errors import ZllmError
from zllm.private_files import private_dir, private_umask, tighten

log = logging.getLogger("zllm.control")

Params = dict[str, Any]
Method = Callable[[Params], Awaitable[Any]]
Stream = Callable[[Params], AsyncIterator[Any]]


class ControlServer:
    def __init__(self, path: Path, *, version: str, methods: Mapping[str, Method],
                 streams: Mapping[str, Stream] | None = None):
        self.path = Path(path)
        self.version = version
        self._methods = dict(methods)
        self._streams = dict(streams or {})
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self) -> None:
        """The caller holds the daemon's pid lock, so a socket file left here belongs to a dead daemon."""
        check_socket_path(self.path)
        private_dir(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with private_umask():  # bind() creates the socket file from the umask: born 0600, no window to chmod
            self._server = await asyncio.start_unix_server(self._serve_connection, path=str(self.path),
                                                           limit=MAX_LINE_BYTES)
        tighten(self.path)  # 0700 from the umask to 0600: the x bit means nothing on a socket

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()  # a follower writes its shutdown end marker on the way out
        if self._connections:
            await asyncio.wait(self._connections, timeout=2)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = None

    # ------------------------------------------------------------------ one connection

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            while line := await reader.readline():
                if not await self._answer(line, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the client went away, or sent a line beyond the limit: nothing more to say to it
        except asyncio.CancelledError:
            pass  # the server is closing
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1)

    async def _answer(self, line: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request line; False when the connection is done (after a stream)."""
        try:
            message = decode(line)
        except ValueError as exc:
            await self._send(writer, reply(None, self.version, error=error_body(BAD_REQUEST, f"not JSON: {exc}")))
            return True
        request_id, method = message.get("id"), message.get("method")
        params = message.get("params") or {}
        problem = self._check(message, method, params)
        if problem is not None:
            await self._send(writer, reply(request_id, self.version, error=problem))
            return True
        if method in self._streams:
            await self._run_stream(request_id, method, params, reader, writer)
            return False
        await self._send(writer, await self._call(request_id, method, params))
        return True

    def _check(self, message: dict, method: object, params: object) -> dict | None:
        if message.get("v") != PROTOCOL_VERSION:
            return error_body(PROTOCOL_MISMATCH, f"this daemon speaks control protocol v{PROTOCOL_VERSION}, "
                              f"not v{message.get('v')}", hint="use the zllm CLI of the same version as the daemon")
        if not isinstance(method, str) or not isinstance(params, dict):
            return error_body(BAD_REQUEST, "a request needs a string `method` and an object `params`")
        if method not in self._methods and method not in self._streams:
            return error_body(UNKNOWN_METHOD, f"unknown control method `{method}`",
                              hint=f"known: {', '.join(sorted({*self._methods, *self._streams}))}")
        return None

    async def _call(self, request_id: object, method: str, params: Params) -> dict:
        try:
            result = await self._methods[method](params)
        except ZllmError as exc:
            return reply(request_id, self.version, error=error_body(exc.code, exc.message, exc.hint))
        except Exception as exc:
            log.exception("control method %s failed", method)
            return reply(request_id, self.version, error=error_body(INTERNAL, f"{type(exc).__name__}: {exc}"))
        return reply(request_id, self.version, result=result)

    async def _run_stream(self, request_id: object, method: str, params: Params,
                          reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Pump items until the stream ends, the client hangs up (EOF on its side) or the server closes."""
        pump = asyncio.ensure_future(self._pump(request_id, method, params, writer))
        hangup = asyncio.ensure_future(reader.read())  # b"" at EOF; a stream owns the rest of the connection
        try:
            await asyncio.wait({pump, hangup}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._send_quietly(writer, reply(request_id, self.version, end={"reason": "shutdown"}))
            raise
        finally:
            for task in (pump, hangup):
                task.cancel()
            await asyncio.gather(pump, hangup, return_exceptions=True)

    async def _pump(self, request_id: object, method: str, params: Params, writer: asyncio.StreamWriter) -> None:
        try:
            async for item in self._streams[method](params):
                await self._send(writer, reply(request_id, self.version, item=item))
        except ZllmError as exc:
            await self._send(writer, reply(request_id, self.version, error=error_body(exc.code, exc.message, exc.hint)))
            return
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:
            log.exception("control stream %s failed", method)
            await self._send(writer, reply(request_id, self.version,
                                           error=error_body(INTERNAL, f"{type(exc).__name__}: {exc}")))
            return
        await self._send(writer, reply(request_id, self.version, end={"reason": "done"}))

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, message: dict) -> None:
        writer.write(encode(message))
        await writer.drain()

    @staticmethod
    async def _send_quietly(writer: asyncio.StreamWriter, message: dict) -> None:
        with contextlib.suppress(Exception):
            writer.write(encode(message))
            await asyncio.wait_for(writer.drain(), 1)
