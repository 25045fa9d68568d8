"""`EngineClient`: the API layer's only view of the core (one production class in runtime/, one fake in tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from zllm.canonical.events import Event
from zllm.canonical.finish import Usage
from zllm.canonical.request import ChatRequest
from zllm.diagnosis.records import CacheDiagnosis


@dataclass(frozen=True)
class ModelCard:
    """A model being served, as `GET /v1/models` shows it."""

    id: str
    created: int          # unix seconds (when it was added to the store)
    context_length: int   # tokens: prompt + output must fit
    owned_by: str = "zllm"


class RequestStream(Protocol):
    """An admitted request. Iterate it for events; the last one is always `Finished`."""

    request_id: str
    prompt_tokens: int

    def __aiter__(self) -> AsyncIterator[Event]: ...

    async def prompt_usage(self) -> Usage:
        """The prompt's split, known once the prefix cache has answered (before the prefill): how many of its
        tokens were restored (`cached_tokens`), how many will be prefilled and kept (`cache_write_tokens`);
        `completion_tokens` 0. `Finished.usage` reports the same split. A request that ends before it starts
        (aborted while waiting, failed at admission) resolves with its Finished usage. Any number of awaits,
        before, during or after iteration."""
        ...

    def abort(self) -> None:
        """Stop generating (client went away). Safe to call at any time, any number of times."""


class EngineClient(Protocol):
    def models(self) -> list[ModelCard]: ...

    async def submit(self, request: ChatRequest) -> RequestStream:
        """Render, validate and queue `request`.

        Raises `ZllmError` (`ModelNotFound`, `ContextLengthExceeded`, `InvalidRequest`, `Overloaded`) before
        any event exists, so the edge can answer with a plain error response instead of a broken stream.
        `sampling.max_tokens` larger than the room left in the window is clamped, never rejected.
        """
        ...

    async def check(self, model: str, request: ChatRequest | None = None) -> None:
        """What `submit` checks before it queues, without queueing anything: `model` is served (`ModelNotFound`)
        and `request`, if given, renders to a prompt that leaves room for at least one output token
        (`ContextLengthExceeded`)."""
        ...

    async def count_tokens(self, request: ChatRequest) -> int:
        """Prompt tokens `request` would use, rendered exactly as `submit` renders it."""
        ...

    async def count_text_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens each text takes alone with the served model's tokenizer (no template, no special tokens):
        what context editing weighs messages with (api/context_edits/sizes.py)."""
        ...

    async def diagnose_cache(self, stream: RequestStream, *, namespace: str, response_id: str,
                             previous_id: str | None) -> CacheDiagnosis | None:
        """Why the admitted `stream`'s prompt cannot reuse all of the one answered as `previous_id` in
        `namespace` (None: nothing to compare, the result is None), then remember this prompt as `response_id`,
        the id its client receives, for a later comparison. A `CacheDiagnosis` with reason "not_found" when
        `previous_id` is unknown, "unavailable" when the engine cannot say; never raises for a failed diagnosis
        (zllm/diagnosis/service.py)."""
        ...
