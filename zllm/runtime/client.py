"""`LocalEngineClient`: the production `zllm.canonical.EngineClient`, serving one loaded model in-process.

    client = zllm.engines.local_client(path, settings, name="smollm2", created=added_at)   # the daemon's wiring
    stream = await client.submit(request)                              # raises ZllmError before any event
    async for event in stream: ...                                     # TextDelta..., then exactly one Finished
    client.close()                                                     # aborts live requests, stops the thread
    # or, from an already loaded model: LocalEngineClient(load_for_backend(path, ...), "smollm2", created)

The backend is one object (engine/loaded.py: engine, tokenizer, facts, prefix cache, drafter): nothing here
asks which backend serves the model.

Prompt rendering runs in the default thread-pool executor (a 30K-token prompt takes tens of milliseconds to
tokenize; the event loop must not stall on it), big prompts at most `BIG_PROMPT_SLOTS` at once (each takes
seconds and several times its size in memory); a prompt whose length proves it cannot fit the window is
refused before it is tokenized (prompt/length_bound.py). All engine work runs on the engine thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from zllm.canonical import ChatRequest, Event, Usage
from zllm.diagnosis.fingerprint_store import FingerprintStore
from zllm.diagnosis.records import RequestFingerprint
from zllm.engine.loaded import DraftModel, LoadedModel
from zllm.engine.sampler import SamplingConfig
from zllm.errors import Overloaded
from zllm.ids import tool_call_id as new_tool_call_id
from zllm.kvcache import CacheConfig
from zllm.kvcache.contract import KVPrefixCache
from zllm.prompt import RenderedPrompt
from zllm.runtime.client_base import ClientBase, QueuedStream
from zllm.runtime.engine_loop import EngineLoop, EngineRequest
from zllm.runtime.fence import Fence
from zllm.runtime.loop_guard import LoopGuard
from zllm.runtime.prefix import build_prefix_cache, served_model_key
from zllm.runtime.report import RequestReport
from zllm.runtime.scheduler import SchedulerConfig
from zllm.runtime.speculative import SpeculationConfig

_T = TypeVar("_T")

# prompts of more text than this are rendered a few at a time: tokenizing 1M characters takes about a second
BIG_PROMPT_CHARS = 1 << 20
BIG_PROMPT_SLOTS = 2

# a draft token costs a draft-model forward: drafts are shorter than prompt lookup's, and drafted on every step
DRAFT_MODEL_SPECULATION = {"max_draft": 5, "max_backoff": 4}


class LocalRequestStream(QueuedStream):
    def __init__(self, request_id: str, prompt_tokens: int, engine_request: EngineRequest,
                 events: asyncio.Queue[Event], prompt_split: asyncio.Future[Usage],
                 fingerprint: RequestFingerprint | None = None):
        """`prompt_split` is set from the engine thread (EngineRequest.report_prompt)."""
        super().__init__(request_id, prompt_tokens, events, prompt_split, fingerprint)
        self._engine_request = engine_request

    def abort(self) -> None:
        self._engine_request.abort()


class LocalEngineClient(ClientBase):
    def __init__(self, loaded: LoadedModel, model_name: str, created: int, *, max_queue: int = 64,
                 cache_config: CacheConfig | None = None, prefix_cache: bool = True,
                 observer: Callable[[RequestReport], None] | None = None, dialect: str | None = None,
                 speculative: bool = False, scheduler: SchedulerConfig | None = None,
                 draft_model: DraftModel | None = None, owns_engine: bool = False,
                 fingerprints: FingerprintStore | None = None):
        """`cache_config` None: a device-tier-only prefix cache with the default budget; `prefix_cache=False`
        turns it off (every request cold). `observer` gets a RequestReport per request start and end, on the
        engine thread (it must only hand off, e.g. TraceHub.publish). `dialect` names the tool dialect
        (None / "auto": chosen from the tokenizer, see dialects/registry.py). `scheduler`: batch size and prefill
        chunking (runtime/scheduler.py). `draft_model`: drafts for speculative decoding (implies `speculative`).
        `fingerprints`: where cache diagnostics keep prompt fingerprints (None: in memory, for this client's life)."""
        self.loaded = loaded
        self._owns_engine = owns_engine  # close the backend (its weights, llama.cpp's context) with the client
        super().__init__(loaded.tokenizer, model_name=model_name, created=created, max_queue=max_queue,
                         generation_eos=loaded.generation_eos, eos_token_id=loaded.text_config.eos_token_id,
                         vocab_size=loaded.vocab_size, dialect=dialect, fingerprints=fingerprints)
        self.speculation = (SpeculationConfig(**DRAFT_MODEL_SPECULATION) if draft_model is not None
                            else SpeculationConfig() if speculative else None)
        if draft_model is not None:
            loaded.check_draft_model()
        self.prefix_cache: KVPrefixCache[Any] | None = (
            build_prefix_cache(loaded, cache_config, max_batch=(scheduler or SchedulerConfig()).max_batch)
            if prefix_cache else None)
        self.engine = EngineLoop(loaded.engine, loaded.tokenizer, self.stop_token_ids, threads=loaded.threads,
                                 prefix_cache=self.prefix_cache, model_key=served_model_key(loaded),
                                 observer=observer, scheduler=scheduler, draft_model=draft_model,
                                 hidden_ids=self.hidden_ids,
                                 out_of_memory=loaded.out_of_memory)
        self.engine.start()
        self._big_prompt_slots = asyncio.Semaphore(BIG_PROMPT_SLOTS)

    @property
    def queue_waiting(self) -> int:
        """Requests admitted but not yet started by the engine (`zllm status`; --max-queue bounds it)."""
        return self.engine.waiting

    @property
    def context_length(self) -> int:
        return self.loaded.context_length

    async def submit(self, request: ChatRequest) -> LocalRequestStream:
        self._check_model(request.model)
        self._check_queue()
        prompt, fence, fingerprint = await self._off_loop(self._prepare, request)
        prompt_tokens = len(prompt.token_ids)
        room = self._room(prompt_tokens)
        self._check_queue()  # again: others may have queued while this prompt was rendering
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        prompt_split: asyncio.Future[Usage] = loop.create_future()
        engine_request = EngineRequest(
            request_id=request.id,
            prompt_ids=prompt.token_ids,
            sampling=_sampling_config(request),
            # a prefill-only request samples nothing: one token's budget keeps its decode reservation minimal
            max_tokens=1 if request.prefill_only else min(request.sampling.max_tokens or room, room),
            sink=lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
            # queued before Finished on the same loop: the split is always known before the stream ends
            prompt_sink=lambda usage: loop.call_soon_threadsafe(prompt_split.set_result, usage),
            stop_strings=request.sampling.stop,
            stop_token_ids=frozenset(request.sampling.stop_token_ids),
            turn_stop_ids=self.turn_stop_ids(request),
            namespace=request.namespace,
            cache_hint=request.cache_hint,
            describe_position=self.diagnosis.describer(request),
            api=request.api,
            model=request.model,
            notes=(*self.diagnosis.trace_notes(request, prompt), *request.notes),
            # the core owns each call's id (minted as the parser opens the call); APIs only spell it: api/call_ids.py
            parser=self.dialect.parser(request.tools, thinking=self.renderer.thinking(request),
                                       new_call_id=new_tool_call_id),
            fence=fence,
            loop_guard=LoopGuard(),
            speculation=None if request.prefill_only else self.speculation,  # a drafter would prefill for nothing
            prefill_only=request.prefill_only,
            dialect=self.dialect.name,
            fence_label=fence_label(request) if fence is not None else "off",
        )
        stream = LocalRequestStream(request.id, prompt_tokens, engine_request, events, prompt_split,
                                    fingerprint=fingerprint)
        self.engine.submit(engine_request)
        return stream

    async def count_tokens(self, request: ChatRequest) -> int:
        self._check_model(request.model)
        return len((await self._render(request)).token_ids)

    def close(self, timeout: float | None = 30.0) -> None:
        """Abort live requests (each still ends with Finished(ABORT)) and stop the engine thread."""
        self.engine.shutdown(timeout)
        if self._owns_engine and not self.engine.alive:
            self.loaded.close()  # llama.cpp's context and weights: only once the engine thread is gone
        self.diagnosis.close()

    async def aclose(self, timeout: float | None = 30.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close, timeout)

    def _check_queue(self) -> None:
        if self.queue_waiting >= self.max_queue:
            raise Overloaded(f"{self.queue_waiting} requests are already waiting for the engine",
                             hint="retry shortly, or raise --max-queue")

    def _prepare(self, request: ChatRequest) -> tuple[RenderedPrompt, Fence | None, RequestFingerprint]:
        """Render the prompt, compile the request's fence and fingerprint the prompt (off the event loop: each
        takes milliseconds). A grammar llguidance rejects (an unsupported schema) fails here, before anything
        streams."""
        prompt = self.renderer.render(request, window=self.context_length)
        spec = self._fence_spec(request)
        grammar = self.dialect.fence_grammar(spec, self.markup) if spec.constrains else None
        fence = self.fences.compile(grammar) if grammar is not None else None
        return prompt, fence, self.diagnosis.fingerprint(request, prompt)

    async def _render(self, request: ChatRequest) -> RenderedPrompt:
        return await self._off_loop(partial(self.renderer.render, window=self.context_length), request)

    async def _off_loop(self, work: Callable[[ChatRequest], _T], request: ChatRequest) -> _T:
        """`work(request)` in the default executor; a big prompt first waits for one of the big-prompt slots."""
        loop = asyncio.get_running_loop()
        if prompt_chars(request) <= BIG_PROMPT_CHARS:
            return await loop.run_in_executor(None, work, request)
        async with self._big_prompt_slots:
            return await loop.run_in_executor(None, work, request)


def prompt_chars(request: ChatRequest) -> int:
    """About how much text the request's prompt holds (its messages' text and the tools' descriptions)."""
    messages = sum(len(m.content) + len(m.reasoning or "") + sum(len(c.arguments) for c in m.tool_calls)
                   for m in request.messages)
    return messages + sum(len(tool.description) for tool in request.tools)


def fence_label(request: ChatRequest) -> str:
    parts = [f"tools:{request.tool_choice.mode}"] if request.tools else []
    if request.response_format is not None:
        parts.append("json_schema")
    return ",".join(parts) or "on"


def _sampling_config(request: ChatRequest) -> SamplingConfig:
    params = request.sampling
    return SamplingConfig(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, seed=params.seed)

