"""Recent history plus live subscribers, fed from any thread: what `zllm trace` and `zllm logs` read.

    hub = TraceHub(loop)                            # on the event loop that serves the control socket
    LocalEngineClient(..., observer=hub.publish)    # publish() runs on the engine thread: it only hands off
    hub.recent(5)                                   # the last 5 finished RequestReports (loop thread)
    hub.prefilling(), hub.running                   # unfinished requests: prefilling (with progress), decoding
    with hub.subscribe() as feed:                   # every report from now on: "prefilling", "started", "finished"
        report = await feed.get()

    logs = LogHub(loop); logging.getLogger().addHandler(logs)   # the same for formatted log lines

All state lives on the loop thread: `publish` moves the item there with `call_soon_threadsafe`, so the ring
and the subscriber set need no lock. A subscriber that does not keep up loses its oldest items (counted in
`dropped`), never blocks the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from zllm.runtime.report import RequestReport

T = TypeVar("T")


class Feed(Generic[T]):
    """One subscriber's bounded queue."""

    def __init__(self, capacity: int):
        self._queue: asyncio.Queue[T] = asyncio.Queue(maxsize=capacity)
        self.dropped = 0

    def offer(self, item: T) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(item)

    async def get(self) -> T:
        return await self._queue.get()


class BroadcastRing(Generic[T]):
    def __init__(self, loop: asyncio.AbstractEventLoop, *, capacity: int = 256, feed_capacity: int = 1024):
        self._loop = loop
        self._ring: deque[T] = deque(maxlen=capacity)
        self._feeds: set[Feed[T]] = set()
        self._feed_capacity = feed_capacity

    def publish(self, item: T) -> None:
        """Any thread. After the loop has closed (shutdown) items are dropped."""
        try:
            self._loop.call_soon_threadsafe(self._deliver, item)
        except RuntimeError:
            pass

    def recent(self, n: int) -> list[T]:
        """Loop thread only: the newest `n` kept items, oldest first."""
        items = list(self._ring)
        return items[-n:] if n > 0 else []

    @contextmanager
    def subscribe(self) -> Iterator[Feed[T]]:
        """Loop thread only. Subscribing and reading `recent()` with no await between misses nothing."""
        feed: Feed[T] = Feed(self._feed_capacity)
        self._feeds.add(feed)
        try:
            yield feed
        finally:
            self._feeds.discard(feed)

    def _deliver(self, item: T) -> None:
        if self._keep(item):
            self._ring.append(item)
        for feed in self._feeds:
            feed.offer(item)

    def _keep(self, item: T) -> bool:
        return True


class TraceHub(BroadcastRing[RequestReport]):
    """Keeps finished reports (one per request) in the ring; subscribers see every phase. Also keeps the newest
    report of each request that has not finished: those prefilling (with their progress) and those started."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, capacity: int = 256):
        super().__init__(loop, capacity=capacity)
        self._live: dict[str, RequestReport] = {}  # request id → its newest "prefilling" / "started" report

    @property
    def running(self) -> int:
        """Requests prefilled and not finished (decoding)."""
        return sum(1 for report in self._live.values() if report.phase == "started")

    def prefilling(self) -> list[RequestReport]:
        """The newest progress report of each request still prefilling, oldest request first (loop thread)."""
        return [report for report in self._live.values() if report.phase == "prefilling"]

    def live(self) -> list[RequestReport]:
        """The newest report of each unfinished request, oldest request first (loop thread)."""
        return list(self._live.values())

    def find(self, request_id: str) -> RequestReport | None:
        """The newest finished report of `request_id` still in the ring (loop thread)."""
        return next((r for r in reversed(self._ring) if r.request_id == request_id), None)

    def _keep(self, item: RequestReport) -> bool:
        if item.phase != "finished":
            self._live[item.request_id] = item  # replaces: a request keeps its place in arrival order
            return False
        self._live.pop(item.request_id, None)
        return True


class LogHub(logging.Handler):
    """A logging handler keeping the newest formatted lines for `zllm logs` over the control socket."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, capacity: int = 1000,
                 fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s"):
        super().__init__()
        self.ring: BroadcastRing[str] = BroadcastRing(loop, capacity=capacity)
        self.setFormatter(logging.Formatter(fmt))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.ring.publish(self.format(record))
        except Exception:
            self.handleError(record)
