"""Where `previous_response_id` is looked up: this WebSocket connection's own responses first (they are kept
even with `store: false`, which Codex sends while chaining), then the sqlite store (`store: true` ones).

sqlite never runs on the event loop: every store call goes to one dedicated executor thread, in order.
A save is submitted the moment a response finishes, before its terminal event is sent, so any later
lookup (queued behind it on the same thread) sees it, and a client hanging up cannot lose it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from zllm.api.openai_responses.compaction_seal import CompactionSeal
from zllm.errors import ZllmError
from zllm.store import ResponseStore, StoredResponse

log = logging.getLogger("zllm.api")

# a client chains to its latest response; a few more cover retries of an earlier turn
CONNECTION_RESPONSES = 16


class PreviousResponseNotFound(ZllmError):
    code = "previous_response_not_found"

    def __init__(self, response_id: str):
        super().__init__(f"Previous response with id '{response_id}' not found.", param="previous_response_id")


class ResponseNotFound(ZllmError):
    code = "response_not_found"

    def __init__(self, response_id: str):
        super().__init__(f"No response found with id '{response_id}'.", param="response_id")


class BackgroundStore:
    """A `ResponseStore` driven from one executor thread (one writer; calls run in submission order)."""

    def __init__(self, store: ResponseStore):
        self.store = store
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zllm-responses")

    def save_soon(self, record: StoredResponse) -> Future:
        future = self._executor.submit(self.store.save, record)
        future.add_done_callback(_log_failure)
        return future

    async def load(self, response_id: str, namespace: str) -> StoredResponse | None:
        return await asyncio.wrap_future(self._executor.submit(self.store.load, response_id, namespace))

    async def delete(self, response_id: str, namespace: str) -> bool:
        return await asyncio.wrap_future(self._executor.submit(self.store.delete, response_id, namespace))

    def close(self) -> None:
        """Finish pending saves, then stop the thread (the store itself belongs to whoever opened it)."""
        self._executor.shutdown(wait=True)


def _log_failure(future: Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("could not save a response", exc_info=future.exception())


class ConnectionResponses:
    """The last few responses of one WebSocket connection, stored or not."""

    def __init__(self, capacity: int = CONNECTION_RESPONSES):
        self.capacity = capacity
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str) -> StoredResponse | None:
        return self._records.get(response_id)

    def put(self, record: StoredResponse) -> None:
        self._records[record.id] = record
        self._records.move_to_end(record.id)
        while len(self._records) > self.capacity:
            self._records.popitem(last=False)


class ResponseChain:
    """What a turn continues from: a previous response, or (`seal`) the compaction items of its input."""

    def __init__(self, store: BackgroundStore, connection: ConnectionResponses | None = None,
                 seal: CompactionSeal | None = None):
        self.store = store
        self.connection = connection
        self.seal = seal

    async def previous(self, response_id: str | None, namespace: str) -> StoredResponse | None:
        """The response a turn continues; raises `PreviousResponseNotFound` for an unknown id, and for one
        another API key created (namespaces are isolated: it does not exist for this caller)."""
        if response_id is None:
            return None
        record = self.connection.get(response_id) if self.connection is not None else None
        if record is None:
            record = await self.store.load(response_id, namespace)
        if record is None or record.namespace != namespace:
            raise PreviousResponseNotFound(response_id)
        return record

    def remember(self, record: StoredResponse, *, persist: bool) -> None:
        """Synchronous on purpose: called from the encoder right before the terminal event goes out."""
        if self.connection is not None:
            self.connection.put(record)
        if persist:
            self.store.save_soon(record)
