"""`FakeEngineClient`: a scripted stand-in for the runtime behind `zllm.canonical.EngineClient`.

    engine = FakeEngineClient()                         # serves "fake-model" (8192-token window)
    engine.script(text_events("Hel", "lo"))             # the next request streams these events
    engine.script(tool_call_events("sh", '{"cmd":"ls"}'), delay=0.05)
    engine.fail_next(Overloaded("queue full"))          # the next submit() raises
    engine.prompt_tokens = 9000                          # submit() raises ContextLengthExceeded
    ... run requests ...
    engine.submitted[-1]          # the ChatRequest the edge produced
    engine.aborted                # request ids whose stream was aborted

Scripts are used in order, one per submit(); with none queued the default is `text_events("Hello", " world")`
over the counted prompt. `prompt_usage()` is the script's Finished usage (output 0).
Every stream ends with exactly one `Finished` (an aborted one with ABORT), like the real runtime.
The lists are appended from the server's event loop and may be read from another thread.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

from zllm.canonical import (
    ChatRequest,
    Event,
    Finished,
    FinishReason,
    ModelCard,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from zllm.diagnosis.records import CacheDiagnosis
from zllm.errors import ContextLengthExceeded, ModelNotFound, ZllmError

FAKE_MODEL = ModelCard(id="fake-model", created=1_700_000_000, context_length=8192)


def text_events(*parts: str, reason: FinishReason = FinishReason.STOP, prompt_tokens: int = 10,
                cached_tokens: int = 0, stop_sequence: str | None = None) -> list[Event]:
    usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=len(parts), cached_tokens=cached_tokens)
    return [*(TextDelta(p) for p in parts), Finished(reason, usage, stop_sequence=stop_sequence)]


def tool_call_events(name: str, arguments: str, *, call_id: str = "call_fake0", index: int = 0,
                     chunk: int = 4, text: str = "", prompt_tokens: int = 10) -> list[Event]:
    """Optional text, then one tool call whose arguments stream in `chunk`-character deltas."""
    deltas = [ToolCallArgsDelta(index, arguments[i:i + chunk]) for i in range(0, len(arguments), chunk)]
    usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=len(deltas) + 2)
    return [
        *([TextDelta(text)] if text else []),
        ToolCallStart(index, call_id, name),
        *deltas,
        ToolCallEnd(index, arguments),
        Finished(FinishReason.TOOL_CALLS, usage),
    ]


def error_events(*parts: str, code: str = "engine_error", message: str = "CUDA out of memory") -> list[Event]:
    usage = Usage(prompt_tokens=10, completion_tokens=len(parts))
    return [*(TextDelta(p) for p in parts),
            Finished(FinishReason.ERROR, usage, error_code=code, error_message=message)]


@dataclass
class _Script:
    events: Sequence[Event]
    delay: float  # seconds before each event


class FakeRequestStream:
    def __init__(self, request: ChatRequest, script: _Script, prompt_tokens: int, engine: FakeEngineClient):
        self.request_id = request.id
        self.prompt_tokens = prompt_tokens
        self._script = script
        self._engine = engine
        self._aborted = asyncio.Event()

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    def abort(self) -> None:
        if not self._aborted.is_set():
            self._aborted.set()
            self._engine.aborted.append(self.request_id)

    async def prompt_usage(self) -> Usage:
        """The split the script's Finished reports (a scripted stream is as consistent as the runtime's)."""
        finished = next((e for e in self._script.events if isinstance(e, Finished)), None)
        usage = finished.usage if finished is not None else Usage(prompt_tokens=self.prompt_tokens, completion_tokens=0)
        return replace(usage, completion_tokens=0)

    async def __aiter__(self) -> AsyncIterator[Event]:
        for event in self._script.events:
            if self._script.delay:
                await self._wait(self._script.delay)
            if self.aborted:
                break
            yield event
            if isinstance(event, Finished):
                return
        yield Finished(FinishReason.ABORT if self.aborted else FinishReason.STOP,
                       Usage(prompt_tokens=self.prompt_tokens, completion_tokens=0))

    async def _wait(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._aborted.wait(), seconds)
        except TimeoutError:
            pass


class FakeEngineClient:
    def __init__(self, models: Sequence[ModelCard] = (FAKE_MODEL,), *, prompt_tokens: int | None = None):
        self._models = list(models)
        # fixed prompt size for every request; None = a crude words-based estimate
        self.prompt_tokens = prompt_tokens
        self._scripts: deque[_Script] = deque()
        self._failures: deque[ZllmError] = deque()
        self.submitted: list[ChatRequest] = []
        self.aborted: list[str] = []
        self.streams: list[FakeRequestStream] = []

    def script(self, events: Sequence[Event], *, delay: float = 0.0) -> FakeEngineClient:
        self._scripts.append(_Script(list(events), delay))
        return self

    def fail_next(self, error: ZllmError) -> FakeEngineClient:
        self._failures.append(error)
        return self

    def models(self) -> list[ModelCard]:
        return list(self._models)

    async def check(self, model: str, request: ChatRequest | None = None) -> None:
        card = self._card(model)
        if request is not None and card.context_length - self._count(request) < 1:
            raise ContextLengthExceeded(self._count(request), card.context_length)

    async def count_tokens(self, request: ChatRequest) -> int:
        return self._count(request)

    async def count_text_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(text.split()) for text in texts]

    async def diagnose_cache(self, stream: FakeRequestStream, *, namespace: str, response_id: str,
                             previous_id: str | None) -> CacheDiagnosis | None:
        """A scripted engine keeps no prompt fingerprints: it cannot say why a prompt missed."""
        if previous_id is None:
            return None
        return CacheDiagnosis("unavailable", previous_id, detail="this engine keeps no prompt fingerprints")

    async def submit(self, request: ChatRequest) -> FakeRequestStream:
        self.submitted.append(request)
        if self._failures:
            raise self._failures.popleft()
        card = self._card(request.model)
        prompt_tokens = self._count(request)
        if prompt_tokens > card.context_length:
            raise ContextLengthExceeded(prompt_tokens, card.context_length)
        script = (self._scripts.popleft() if self._scripts
                  else _Script(text_events("Hello", " world", prompt_tokens=prompt_tokens), 0.0))
        stream = FakeRequestStream(request, script, prompt_tokens, self)
        self.streams.append(stream)
        return stream

    def _card(self, model: str) -> ModelCard:
        for card in self._models:
            if card.id == model:
                return card
        raise ModelNotFound(model, available=[card.id for card in self._models])

    def _count(self, request: ChatRequest) -> int:
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        return sum(4 + len(m.content.split()) for m in request.messages)
