"""`ClientBase` and `QueuedStream`: what both engine clients do alike — `LocalEngineClient` (runtime/client.py: the step-level engines,
in-process) and `VllmEngineClient` (engine/vllm/client.py: a request-level engine behind HTTP).

    class SomeClient(ClientBase):
        def __init__(self, ...):
            super().__init__(tokenizer, model_name=..., created=..., max_queue=..., generation_eos=...,
                             eos_token_id=..., vocab_size=..., dialect=..., fingerprints=...)
        context_length: int            # an attribute or a property
        def _check_queue(self): ...    # how each counts what is queued

It holds the served model's prompt side — renderer, tool dialect, stop tokens, fence compiler, cache diagnosis —
and the rules a request passes before it queues (`EngineClient.check`, zllm/canonical/client.py): the model is the
one served, and the prompt leaves room for at least one output token. Their request streams are `QueuedStream`s:
events queued on the event loop, read once, aborted when the reader leaves early; each says how to `abort`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from typing import Any

from zllm.canonical import ChatRequest, Event, Finished, ModelCard, Usage
from zllm.diagnosis.explain import MissExplanation
from zllm.diagnosis.fingerprint_store import FingerprintStore
from zllm.diagnosis.near_miss import NearMiss
from zllm.diagnosis.records import CacheDiagnosis, RequestFingerprint
from zllm.diagnosis.service import ServedDiagnosis
from zllm.dialects import Dialect, FenceSpec
from zllm.dialects.registry import DialectChoice
from zllm.errors import ContextLengthExceeded, ModelNotFound
from zllm.prompt import PromptRenderer, model_stop_token_ids
from zllm.prompt.dialect_check import check_renderer
from zllm.prompt.stop_tokens import control_token_ids, single_token_ids
from zllm.runtime.fence import FenceCompiler


class QueuedStream:
    """An admitted request: iterate it (once) for its events; the last one is always `Finished`."""

    def __init__(self, request_id: str, prompt_tokens: int, events: asyncio.Queue[Event],
                 prompt_split: asyncio.Future[Usage], fingerprint: RequestFingerprint | None = None):
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        # the prompt's digests and token ids, for cache diagnostics (zllm/diagnosis/fingerprint.py)
        self.fingerprint = fingerprint
        self._events = events
        self._prompt_split = prompt_split
        self._iterated = False

    def abort(self) -> None:
        raise NotImplementedError

    async def prompt_usage(self) -> Usage:
        return await asyncio.shield(self._prompt_split)  # a cancelled waiter must not cancel the answer

    async def __aiter__(self):
        if self._iterated:
            raise RuntimeError("a request stream can be iterated only once")
        self._iterated = True
        finished = False
        try:
            while not finished:
                event = await self._events.get()
                finished = isinstance(event, Finished)
                yield event
        finally:
            if not finished:  # the consumer stopped listening before the end: stop generating
                self.abort()


class ClientBase:
    context_length: int

    def __init__(self, tokenizer: Any, *, model_name: str, created: int, max_queue: int, generation_eos: Any,
                 eos_token_id: Any, vocab_size: int, dialect: str | None, fingerprints: FingerprintStore | None):
        """`dialect` names the tool dialect (None / "auto": chosen from the tokenizer, see dialects/registry.py);
        `fingerprints`: where cache diagnostics keep prompt fingerprints (None: in memory, for the client's life)."""
        self.model_name = model_name
        self.created = created
        self.max_queue = max_queue
        self.renderer = PromptRenderer(tokenizer, dialect_override=dialect)
        # render → parse → render over this model's template and tokenizer (logged at startup, shown by `zllm ps`)
        self.dialect_check = check_renderer(self.renderer)
        # fingerprints, segments, near-miss explanations: the declared methods below answer with it
        self.diagnosis = ServedDiagnosis(self.renderer, fingerprints)
        _ = self.renderer.length_bound  # read off the vocabulary now, not during the first request
        self.stop_token_ids = (model_stop_token_ids(tokenizer, generation_eos, eos_token_id)
                               - single_token_ids(tokenizer, self.dialect.continues_turn)
                               ) | single_token_ids(tokenizer, self.dialect.end_of_turn)
        self.fences = FenceCompiler(tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_token_ids)
        # checks the dialect's literals against this tokenizer now: a dialect it cannot satisfy fails at startup
        self.markup = self.fences.markup_tokens(self.dialect)
        self.hidden_ids = control_token_ids(tokenizer, self.dialect.markup)  # never shown as text
        self._text_turn_end_ids = single_token_ids(tokenizer, self.dialect.ends_text_turn)

    @property
    def dialect(self) -> Dialect:
        return self.renderer.dialect

    @property
    def dialect_choice(self) -> DialectChoice:
        """Which tool dialect this model speaks and why (for `zllm ps` and the startup log)."""
        return self.renderer.choice

    def models(self) -> list[ModelCard]:
        return [ModelCard(id=self.model_name, created=self.created, context_length=self.context_length)]

    async def check(self, model: str, request: ChatRequest | None = None) -> None:
        self._check_model(model)
        if request is not None:
            self._room(await self.count_tokens(request))

    async def count_tokens(self, request: ChatRequest) -> int:
        raise NotImplementedError

    async def count_text_tokens(self, texts: Sequence[str]) -> list[int]:
        def count() -> list[int]:
            return [len(self.renderer.tokenizer.encode(text, add_special_tokens=False)) for text in texts]

        return await asyncio.get_running_loop().run_in_executor(None, count)

    async def diagnose_cache(self, stream: Any, *, namespace: str, response_id: str,
                             previous_id: str | None) -> CacheDiagnosis | None:
        """Why `stream`'s prompt cannot reuse all of `previous_id`'s (None: nothing to compare), then keep its
        fingerprint as `response_id` (zllm/diagnosis/service.py). Off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, partial(
            self.diagnosis.compare_and_keep, stream.fingerprint, namespace=namespace, response_id=response_id,
            previous_id=previous_id))

    def cache_diagnosis(self, response_id: str) -> tuple[str, CacheDiagnosis] | None:
        """(namespace, diagnosis) made for `response_id` (`zllm cache explain-miss --id`). Blocking."""
        return self.diagnosis.kept(response_id)

    def explain_near_miss(self, record: NearMiss) -> MissExplanation:
        """A near-miss record of this model's prefix cache, explained (`zllm cache explain-miss`). Blocking."""
        return self.diagnosis.explain_near_miss(record)

    def turn_stop_ids(self, request: ChatRequest) -> frozenset[int]:
        """End-of-turn ids `request` adds to the model's: a marker that ends a turn of text and opens a call too
        (GigaChat 3's `<|message_sep|>`) stops nothing where a call may follow, and ends the turn where none can
        (no tools, or tool_choice none), where nothing else would stop a model that writes on past it."""
        calls_possible = bool(request.tools) and request.tool_choice.mode != "none"
        return frozenset() if calls_possible else self._text_turn_end_ids

    def _fence_spec(self, request: ChatRequest) -> FenceSpec:
        """What the request's fence must enforce: its tools and tool choice, the reasoning block, a response schema."""
        return FenceSpec(tools=request.tools, choice=request.tool_choice, thinking=self.renderer.thinking(request),
                         response_schema=request.response_format.schema if request.response_format else None)

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise ModelNotFound(model, available=[self.model_name])

    def _room(self, prompt_tokens: int) -> int:
        """The room a prompt leaves for output: it must leave at least one token."""
        room = self.context_length - prompt_tokens
        if room < 1:
            raise ContextLengthExceeded(prompt_tokens, self.context_length)
        return room
