"""The responses being generated right now, by id, so `POST /v1/responses/{id}/cancel` can stop one.

    with in_flight.track(turn, namespace):          # around the pump: SSE, WebSocket and non-streaming alike
        ... feed turn.stream to turn.encoder ...
    entry = in_flight.find(response_id, namespace)  # None once it ended, and for another API key's responses
    response = await entry.cancel()                 # aborts the engine request, waits for the pump to end

A cancel and a disconnect both end the engine request with `Finished(ABORT)`; the encoder tells them apart by
its `cancelled` mark, so only a cancelled response gets a terminal event and is recorded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from zllm.api.openai_responses.encode import ResponseEventEncoder
from zllm.api.openai_responses.turn import Turn
from zllm.canonical import RequestStream

log = logging.getLogger("zllm.api")

# the engine ends an aborted request at its next step (one decode step or prefill chunk); this is the bound
# for one stuck far longer, after which the cancel answers without waiting for the stream's end
CANCEL_WAIT_S = 10.0


@dataclass
class InFlightResponse:
    namespace: str
    stream: RequestStream
    encoder: ResponseEventEncoder
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        """Cancel without waiting: the pump sends the terminal event when the stream ends (WebSocket
        `response.cancel`)."""
        self.encoder.cancel()
        self.stream.abort()

    async def cancel(self, wait_s: float = CANCEL_WAIT_S) -> dict:
        """The response as its stream ended: "cancelled", or whatever it reached first had it just finished."""
        self.stop()
        try:
            await asyncio.wait_for(self.ended.wait(), wait_s)
        except TimeoutError:
            log.warning("request %s did not end within %.0fs of its cancel", self.stream.request_id, wait_s)
        return self.encoder.final or self.encoder.cancelled_snapshot()


class InFlightResponses:
    def __init__(self) -> None:
        self._by_id: dict[str, InFlightResponse] = {}

    @contextmanager
    def track(self, turn: Turn, namespace: str) -> Iterator[InFlightResponse]:
        response_id = turn.encoder.response["id"]
        entry = self._by_id[response_id] = InFlightResponse(namespace, turn.stream, turn.encoder)
        try:
            yield entry
        finally:
            del self._by_id[response_id]
            entry.ended.set()

    def find(self, response_id: str, namespace: str) -> InFlightResponse | None:
        entry = self._by_id.get(response_id)
        return entry if entry is not None and entry.namespace == namespace else None
