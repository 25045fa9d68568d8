"""`VllmEngineClient`: the API layer's `EngineClient` (and the control layer's `ServedEngine`) over a vLLM server.

    client = VllmEngineClient.open(model_dir, base_url, name="smollm2", created=..., context_length=8192)
    stream = await client.submit(request)      # rendered and tokenized here; raises ZllmError before any event
    async for event in stream: ...             # TextDelta..., then exactly one Finished
    await client.aclose()

It sits beside the local client (runtime/client.py), not under the step seam: vLLM schedules, samples and keeps
the KV, and returns no per-step logits. zllm keeps everything above the engine: the prompt is rendered with
zllm's template and dialect and tokenized with the model directory's tokenizer, the token ids streamed back go
through zllm's detokenizer, stop rules and the dialect's stream parser (runtime/turn_output.py); the fence is
the dialect's llguidance grammar, compiled here first (a bad schema is a 400 before vLLM sees it) and then
passed to vLLM verbatim; the namespace becomes vLLM's `cache_salt`; the loop guard watches the stream (it can
stop a loop, not ban its next token: vLLM samples); usage's `cached_tokens` is vLLM's own.

Cancellation: a consumer that stops listening closes the HTTP stream, and vLLM aborts a request whose client
disconnected (its `with_cancellation`): the vLLM request is gone with the zllm one.

Prefix-cache views (`cache ls`, near misses) need an index of what vLLM holds: `prefix_cache` is None until the
one prefix cache takes a KV interface with no KV of its own (a remote one) — the seam is `prefix_cache` below and
`SentPrompts`, which for now only estimates the split that Anthropic's `message_start` must report before vLLM
states it (at the end of the stream).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from zllm.canonical import ChatRequest, Event, Finished, FinishReason, ModelCard, Usage
from zllm.diagnosis.fingerprint_store import FingerprintStore
from zllm.diagnosis.records import CacheDiagnosis, RequestFingerprint
from zllm.diagnosis.service import ServedDiagnosis
from zllm.dialects import Dialect, FenceSpec
from zllm.dialects.registry import DialectChoice
from zllm.engine.vllm import wire
from zllm.errors import ContextLengthExceeded, EngineFailure, InvalidRequest, ModelNotFound, Overloaded
from zllm.ids import tool_call_id as new_tool_call_id
from zllm.prompt import PromptRenderer, RenderedPrompt, model_stop_token_ids
from zllm.prompt.dialect_check import check_renderer
from zllm.prompt.stop_tokens import control_token_ids, single_token_ids
from zllm.prompt.tokenizer_files import TokenizerFiles, read_model_json
from zllm.runtime.detokenizer import IncrementalDetokenizer
from zllm.runtime.fence import FenceCompiler
from zllm.runtime.loop_guard import LoopGuard
from zllm.runtime.output import OutputProcessor
from zllm.runtime.report import RequestReport
from zllm.runtime.stops import StopTokens
from zllm.runtime.turn_output import PlainTextParser, TurnOutput

log = logging.getLogger("zllm.engine.vllm")

# vLLM's prefix cache works in whole blocks (--block-size; zllm starts it with 32)
BLOCK_TOKENS = 32
_FINISH = {"length": FinishReason.LENGTH, "repetition": FinishReason.REPETITION, "abort": FinishReason.ABORT}


class SentPrompts:
    """The last prompts (and outputs) sent per namespace: what vLLM's block cache most likely holds, for the
    split reported before vLLM states it. An estimate (vLLM may have evicted a block); Finished's usage is exact."""

    def __init__(self, keep: int = 64, block: int = BLOCK_TOKENS):
        self._sequences: OrderedDict[tuple[str, tuple[int, ...]], None] = OrderedDict()
        self._keep, self._block = keep, block

    def estimate(self, namespace: str, prompt: Sequence[int]) -> int:
        best = 0
        for space, sequence in self._sequences:
            if space == namespace:
                best = max(best, _common_prefix(sequence, prompt))
        usable = min(best, len(prompt) - 1)  # the last prompt token is always computed
        return usable - usable % self._block

    def add(self, namespace: str, sequence: Sequence[int]) -> None:
        key = (namespace, tuple(sequence))
        self._sequences[key] = None
        self._sequences.move_to_end(key)
        while len(self._sequences) > self._keep:
            self._sequences.popitem(last=False)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class VllmRequestStream:
    """An admitted request: iterate it (once) for its events; the last one is always `Finished`."""

    def __init__(self, request_id: str, prompt_tokens: int, run: Callable[[], Any], split: asyncio.Future[Usage],
                 fingerprint: RequestFingerprint | None):
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.fingerprint = fingerprint
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._split = split
        self._task = asyncio.get_running_loop().create_task(run(self._events.put_nowait))
        self._iterated = False

    def abort(self) -> None:
        self._task.cancel()  # closes the HTTP stream: vLLM aborts the request; run() still sends Finished(ABORT)

    async def prompt_usage(self) -> Usage:
        return await asyncio.shield(self._split)

    async def __aiter__(self):
        if self._iterated:
            raise RuntimeError("a request stream can be iterated only once")
        self._iterated = True
        finished = False
        try:
            while True:
                event = await self._events.get()
                finished = isinstance(event, Finished)
                yield event
                if finished:
                    return
        finally:
            if not finished:
                self.abort()


class VllmEngineClient:
    backend = "vllm"

    def __init__(self, tokenizer: TokenizerFiles, config: dict, generation_eos, *, base_url: str, served_model: str,
                 model_name: str, created: int, context_length: int, dialect: str | None = None,
                 max_queue: int = 64, fingerprints: FingerprintStore | None = None,
                 observer: Callable[[RequestReport], None] | None = None, layout: str = "",
                 session: aiohttp.ClientSession | None = None):
        """`base_url`: the vLLM server (http://host:port); `served_model`: the model name it serves;
        `context_length`: its max_model_len. `layout`: its parallel layout, for `zllm ps`."""
        self.base_url = base_url.rstrip("/")
        self.served_model = served_model
        self.model_name = model_name
        self.created = created
        self.context_length = context_length
        self.max_queue = max_queue
        self.layout = layout
        self._observer = observer
        self.renderer = PromptRenderer(tokenizer, dialect_override=dialect)
        self.dialect_check = check_renderer(self.renderer)
        self.diagnosis = ServedDiagnosis(self.renderer, fingerprints)
        _ = self.renderer.length_bound
        text_config = config.get("text_config") or config
        self.stop_token_ids = (model_stop_token_ids(tokenizer, generation_eos, text_config.get("eos_token_id"))
                               - single_token_ids(tokenizer, self.dialect.continues_turn)
                               ) | single_token_ids(tokenizer, self.dialect.end_of_turn)
        self.fences = FenceCompiler(tokenizer, vocab_size=int(text_config.get("vocab_size") or 0),
                                    stop_token_ids=self.stop_token_ids)
        self.markup = self.fences.markup_tokens(self.dialect)
        self._hidden_ids = control_token_ids(tokenizer, self.dialect.markup)
        self._tokenizer = tokenizer
        self._session = session
        self._live: set[asyncio.Task] = set()
        self.sent = SentPrompts()

    @classmethod
    def open(cls, model_dir: str | Path, base_url: str, *, served_model: str, name: str, created: int,
             context_length: int, **options) -> VllmEngineClient:
        """The client for `model_dir` (zllm's copy of the model vLLM serves: its tokenizer, template, config)."""
        model_dir = Path(model_dir)
        tokenizer = TokenizerFiles.from_dir(model_dir)
        config = read_model_json(model_dir / "config.json")
        eos = read_model_json(model_dir / "generation_config.json").get("eos_token_id")
        return cls(tokenizer, config, eos, base_url=base_url, served_model=served_model, model_name=name,
                   created=created, context_length=context_length, **options)

    # ------------------------------------------------------------------ what the control layer reads

    @property
    def dialect(self) -> Dialect:
        return self.renderer.dialect

    @property
    def dialect_choice(self) -> DialectChoice:
        return self.renderer.choice

    @property
    def queue_waiting(self) -> int:
        return 0  # vLLM queues; zllm bounds what it has in flight (max_queue)

    @property
    def prefix_cache(self) -> None:
        return None  # the seam for the one prefix cache over a remote KV (module docstring)

    def explain_near_miss(self, record) -> None:
        return None

    def cache_diagnosis(self, response_id: str) -> tuple[str, CacheDiagnosis] | None:
        return self.diagnosis.kept(response_id)

    # ------------------------------------------------------------------ EngineClient

    def models(self) -> list[ModelCard]:
        return [ModelCard(id=self.model_name, created=self.created, context_length=self.context_length)]

    async def submit(self, request: ChatRequest) -> VllmRequestStream:
        self._check_model(request.model)
        self._check_queue()
        prompt, grammar, fingerprint = await asyncio.get_running_loop().run_in_executor(None, self._prepare, request)
        ids = list(prompt.token_ids)
        room = self._room(len(ids))
        self._check_queue()
        max_tokens = 1 if request.prefill_only else min(request.sampling.max_tokens or room, room)
        split = asyncio.get_running_loop().create_future()
        body = wire.generate_body(request.id, ids, request.sampling, max_tokens=max_tokens,
                                  stop_token_ids=self.stop_token_ids | set(request.sampling.stop_token_ids),
                                  grammar=grammar, salt=wire.cache_salt(request.namespace), model=self.served_model)
        run = partial(self._run, request, ids, body, max_tokens, split)
        stream = VllmRequestStream(request.id, len(ids), run, split, fingerprint)
        self._live.add(stream._task)
        stream._task.add_done_callback(self._live.discard)
        return stream

    async def check(self, model: str, request: ChatRequest | None = None) -> None:
        self._check_model(model)
        if request is not None:
            self._room(await self.count_tokens(request))

    async def count_tokens(self, request: ChatRequest) -> int:
        self._check_model(request.model)
        render = partial(self.renderer.render, window=self.context_length)
        return len((await asyncio.get_running_loop().run_in_executor(None, render, request)).token_ids)

    async def count_text_tokens(self, texts: Sequence[str]) -> list[int]:
        def count() -> list[int]:
            return [len(self._tokenizer.encode(text, add_special_tokens=False)) for text in texts]

        return await asyncio.get_running_loop().run_in_executor(None, count)

    async def diagnose_cache(self, stream: VllmRequestStream, *, namespace: str, response_id: str,
                             previous_id: str | None) -> CacheDiagnosis | None:
        return await asyncio.get_running_loop().run_in_executor(None, partial(
            self.diagnosis.compare_and_keep, stream.fingerprint, namespace=namespace, response_id=response_id,
            previous_id=previous_id))

    async def aclose(self, timeout: float | None = 30.0) -> None:
        for task in list(self._live):
            task.cancel()
        if self._live:
            await asyncio.wait(list(self._live), timeout=timeout)
        if self._session is not None:
            await self._session.close()
        self.diagnosis.close()

    # ------------------------------------------------------------------ one request

    def _prepare(self, request: ChatRequest) -> tuple[RenderedPrompt, str | None, RequestFingerprint]:
        prompt = self.renderer.render(request, window=self.context_length)
        spec = FenceSpec(tools=request.tools, choice=request.tool_choice, thinking=self.renderer.thinking(request),
                         response_schema=request.response_format.schema if request.response_format else None)
        grammar = self.dialect.fence_grammar(spec, self.markup) if spec.constrains else None
        if grammar is not None:
            self.fences.compile(grammar)  # InvalidRequest now, not a vLLM 400 mid-stream (compiled once, cached)
        return prompt, grammar.lark if grammar is not None else None, self.diagnosis.fingerprint(request, prompt)

    def _output(self, request: ChatRequest, max_tokens: int) -> TurnOutput:
        text_stage = OutputProcessor(
            detokenizer=IncrementalDetokenizer(self._tokenizer, skip_special_tokens=False),
            stop_tokens=StopTokens(self.stop_token_ids, frozenset(request.sampling.stop_token_ids)),
            stop_strings=request.sampling.stop, max_tokens=max_tokens,
            token_text=lambda token_id: self._tokenizer.decode([token_id], skip_special_tokens=False),
            hidden_ids=self._hidden_ids)
        parser = self.dialect.parser(request.tools, thinking=self.renderer.thinking(request),
                                     new_call_id=new_tool_call_id)
        return TurnOutput(text_stage, parser or PlainTextParser())

    async def _run(self, request: ChatRequest, ids: list[int], body: dict, max_tokens: int,
                   split: asyncio.Future[Usage], emit: Callable[[Event], None]) -> None:
        """Stream one request from vLLM into `emit`; always ends with exactly one Finished."""
        started = time.perf_counter()
        estimate = self.sent.estimate(request.namespace, ids)
        output = self._output(request, max_tokens)
        guard = LoopGuard()
        generated: list[int] = []
        usage = (len(ids), 0, 0)
        reason: FinishReason | None = None
        stop_sequence = None
        first_at = None
        self._report("started", request, len(ids))

        def resolve_split(cached: int) -> None:
            if not split.done():
                split.set_result(Usage(len(ids), 0, cached))

        try:
            async with self._http().post(self.base_url + wire.GENERATE_PATH, json=body) as response:
                if response.status != 200:
                    raise _refusal(response.status, await response.text())
                async for chunk in _chunks(response):
                    if chunk.error is not None:
                        raise EngineFailure(f"vLLM: {chunk.error}")
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for token_id in () if reason is not None else chunk.token_ids:
                        resolve_split(estimate)
                        first_at = first_at or time.perf_counter()
                        generated.append(token_id)
                        events, ending = output.accept(token_id)
                        for event in events:
                            emit(event)
                        if ending is not None:
                            reason, stop_sequence = ending.reason, ending.stop_sequence
                            break
                        guard.observe(token_id)
                        for name, arguments in output.completed_calls(events):
                            guard.observe_call(name, arguments)
                        if guard.verdict() is not None:
                            reason = FinishReason.REPETITION
                            break
                    if chunk.done:
                        break
                    if chunk.finish_reason is not None:
                        reason = reason or _FINISH.get(chunk.finish_reason)
                        continue  # vLLM ended too: its usage chunk (cached_tokens) follows
                    if reason is not None and chunk.usage is None:
                        break  # zllm ended first (a stop string, the loop guard): closing the stream aborts vLLM's
            if reason is None:
                reason = FinishReason.LENGTH if output.completion_tokens >= max_tokens else FinishReason.STOP
            if reason in (FinishReason.REPETITION, FinishReason.ABORT, FinishReason.LENGTH):
                for event in output.close():
                    emit(event)
            if request.prefill_only:
                reason = FinishReason.PREFILLED
            cached = usage[2] if usage[0] == len(ids) else estimate
            resolve_split(cached)
            completion = 0 if request.prefill_only else output.completion_tokens
            emit(Finished(reason, Usage(len(ids), completion, cached), stop_sequence=stop_sequence))
        except asyncio.CancelledError:
            resolve_split(estimate)
            for event in output.close():
                emit(event)
            emit(Finished(FinishReason.ABORT, Usage(len(ids), output.completion_tokens, estimate)))
            reason = FinishReason.ABORT
        except Exception as exc:  # noqa: BLE001 - every failure ends the stream with Finished(ERROR)
            resolve_split(0)
            error = exc if isinstance(exc, EngineFailure) else EngineFailure(f"vLLM request failed: {exc}")
            log.warning("%s: %s", request.id, error.message)
            emit(Finished(FinishReason.ERROR, Usage(len(ids), output.completion_tokens, 0),
                          error_code=error.code, error_message=error.message))
            reason = FinishReason.ERROR
        finally:
            self.sent.add(request.namespace, (*ids, *generated))
        self._report("finished", request, len(ids), completion=output.completion_tokens, reason=reason,
                     ttft=(first_at - started) if first_at else None)

    def _report(self, phase: str, request: ChatRequest, prompt: int, *, completion: int = 0,
                reason: FinishReason | None = None, ttft: float | None = None) -> None:
        if self._observer is not None:
            self._observer(RequestReport(phase=phase, request_id=request.id, api=request.api, model=request.model,
                                         namespace=request.namespace, prompt_tokens=prompt, prefilled_tokens=prompt,
                                         cache_tier="off", completion_tokens=completion, ttft_s=ttft,
                                         dialect=self.dialect.name,
                                         finish_reason=reason.value if reason is not None else None))

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # no total timeout: a long generation streams for minutes; a dead server shows as a closed connection
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self._session

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise ModelNotFound(model, available=[self.model_name])

    def _room(self, prompt_tokens: int) -> int:
        room = self.context_length - prompt_tokens
        if room < 1:
            raise ContextLengthExceeded(prompt_tokens, self.context_length)
        return room

    def _check_queue(self) -> None:
        if len(self._live) >= self.max_queue:
            raise Overloaded(f"{len(self._live)} requests are already in flight to vLLM",
                             hint="retry shortly, or raise --max-queue")


async def _chunks(response: aiohttp.ClientResponse):
    async for raw in response.content:
        line = raw.decode("utf-8", "replace").strip()
        if line.startswith("data:"):
            chunk = wire.read_chunk(line[5:].strip())
            yield chunk
            if chunk.done:
                return


def _refusal(status: int, text: str) -> Exception:
    try:
        import json
        message = wire.error_message(json.loads(text))
    except ValueError:
        message = text[:500]
    if 400 <= status < 500:
        return InvalidRequest(f"vLLM refused the request: {message}")
    return EngineFailure(f"vLLM answered {status}: {message}")
