"""`ControlClient`: the one typed client of the control socket (protocol.py); the CLI and the tests use it.

    client = ControlClient(settings.control_socket)
    client.status().phase                     # "ready"
    for report in client.trace(last=5, follow=True): ...
    client.cache_prune(older_than_s=3600, dry_run=True).removed

Blocking and dependency-free (the CLI must start fast): one short connection per call. A missing socket, a
refused connection or a daemon that does not answer within `timeout` raise `DaemonUnreachable`; an error the
daemon answers raises `ControlError` with its code, message and hint.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from zllm.cache_views import ALL_TIERS, CacheEntry
from zllm.control.protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    ControlError,
    DaemonStatus,
    DaemonUnreachable,
    LoadedModelInfo,
    PruneReport,
    decode,
    encode,
    request,
)
from zllm.errors import ConfigError

# sun_path is 108 bytes on Linux, including the terminating NUL
MAX_SOCKET_PATH = 107


def check_socket_path(path: Path) -> None:
    if len(str(path).encode()) > MAX_SOCKET_PATH:
        raise ConfigError(f"the control socket path is too long for a unix socket: {path}",
                          hint="set ZLLM_RUNTIME_DIR to a shorter directory")


class ControlClient:
    def __init__(self, path: Path | str, *, timeout: float = 10.0,
                 on_version: Callable[[str], None] | None = None):
        """`on_version(daemon_version)` is called with the version the daemon reports in its first reply."""
        self.path = Path(path)
        self.timeout = timeout
        self.server_version: str | None = None
        self._on_version = on_version
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ typed methods

    def status(self) -> DaemonStatus:
        return DaemonStatus.from_json(self.call("status"))

    def ps(self) -> list[LoadedModelInfo]:
        return [LoadedModelInfo.from_json(m) for m in self.call("ps")["models"]]

    def cache_ls(self) -> list[CacheEntry]:
        return [CacheEntry.from_json(e) for e in self.call("cache.ls")["entries"]]

    def cache_stats(self) -> dict[str, Any]:
        return self.call("cache.stats")

    def cache_prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None,
                    tier: str = ALL_TIERS, namespace: str | None = None, dry_run: bool = False) -> PruneReport:
        params = {"older_than_s": older_than_s, "max_bytes": max_bytes, "tier": tier, "namespace": namespace,
                  "dry_run": dry_run}
        return PruneReport.from_json(self.call("cache.prune", **params))

    def store_stats(self) -> dict[str, Any]:
        return self.call("store.stats")

    def store_prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None) -> dict[str, Any]:
        params = {k: v for k, v in (("older_than_s", older_than_s), ("max_bytes", max_bytes)) if v is not None}
        return self.call("store.prune", **params)

    def near_misses(self) -> list[dict[str, Any]]:
        return self.call("cache.near_misses")["near_misses"]

    def explain(self, request_id: str | None = None) -> dict[str, Any]:
        """The near miss of `request_id` (None: the latest one) and its explanation."""
        return self.call("cache.explain", request_id=request_id)

    def diagnosis(self, response_id: str) -> dict[str, Any]:
        """The cache diagnosis a response carried: {"response_id", "namespace", "diagnosis": {...}}."""
        return self.call("cache.diagnosis", response_id=response_id)

    def trace(self, *, last: int = 20, follow: bool = False) -> Iterator[dict[str, Any]]:
        """The last `last` finished requests' reports, then (follow) every report as it happens."""
        return self.stream("trace", last=last, follow=follow)

    def logs(self, *, last: int = 100, follow: bool = False) -> Iterator[str]:
        return (item["line"] for item in self.stream("logs", last=last, follow=follow))

    def shutdown(self) -> None:
        self.call("shutdown")

    # ------------------------------------------------------------------ transport

    def call(self, method: str, **params: Any) -> Any:
        with self._connect() as conn:
            request_id = self._send(conn, method, params)
            message = self._read(conn, request_id)
        if "result" not in message:
            raise ControlError("bad_reply", f"the daemon answered `{method}` without a result")
        return message["result"]

    def stream(self, method: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Items until the end marker. Leaving the loop early closes the connection (the daemon stops)."""
        conn = self._connect()
        try:
            request_id = self._send(conn, method, params)
            first = True
            while True:
                message = self._read(conn, request_id)
                if first:  # a follow may wait for minutes between items: only the first reply is timed
                    conn.settimeout(None)
                    first = False
                if "end" in message:
                    return
                if "item" not in message:
                    raise ControlError("bad_reply", f"the daemon answered `{method}` without items")
                yield message["item"]
        finally:
            conn.close()

    def _connect(self) -> _Connection:
        check_socket_path(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise DaemonUnreachable(f"no zllm daemon is running (nothing answers on {self.path})",
                                    hint="start one: zllm start") from exc
        except OSError as exc:
            sock.close()
            raise DaemonUnreachable(f"cannot reach the daemon on {self.path}: {exc}",
                                    hint="check `zllm status`; restart it with `zllm restart`") from exc
        return _Connection(sock)

    def _send(self, conn: _Connection, method: str, params: dict[str, Any]) -> int:
        request_id = next(self._ids)
        conn.send(encode(request(request_id, method, {k: v for k, v in params.items() if v is not None})))
        return request_id

    def _read(self, conn: _Connection, request_id: int) -> dict[str, Any]:
        try:
            line = conn.readline()
        except TimeoutError as exc:
            raise DaemonUnreachable(f"the daemon did not answer within {self.timeout:.0f}s",
                                    hint="it may be busy loading a model; check `zllm logs`") from exc
        if not line:
            raise DaemonUnreachable("the daemon closed the control connection",
                                    hint="it may be shutting down; check `zllm status`")
        try:
            message = decode(line)
        except ValueError as exc:
            raise ControlError("bad_reply", f"the daemon sent a malformed reply: {exc}") from None
        self._note_version(message)
        if message.get("v") != PROTOCOL_VERSION:
            raise ControlError("protocol_version", f"the daemon speaks control protocol v{message.get('v')}, "
                               f"this zllm speaks v{PROTOCOL_VERSION}", hint="restart the daemon: zllm restart")
        if "error" in message:
            error = message["error"] or {}
            raise ControlError(str(error.get("code", "internal_error")), str(error.get("message", "")),
                               error.get("hint"))
        if message.get("id") != request_id:
            raise ControlError("bad_reply", f"reply to request {message.get('id')}, expected {request_id}")
        return message

    def _note_version(self, message: dict[str, Any]) -> None:
        if self.server_version is None and isinstance(message.get("zllm"), str):
            self.server_version = message["zllm"]
            if self._on_version is not None:
                self._on_version(self.server_version)


class _Connection:
    """A connected socket read line by line."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._file = sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def readline(self) -> bytes:
        return self._file.readline(MAX_LINE_BYTES)

    def settimeout(self, timeout: float | None) -> None:
        self._sock.settimeout(timeout)

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def __enter__(self) -> _Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
