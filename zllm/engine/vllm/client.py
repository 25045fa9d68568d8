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

Prefix-cache views: the one prefix cache (kvcache/prefix_cache.py) runs over a KV interface that holds no KV
(engine/vllm/kv.py) as zllm's index of the token sequences sent per namespace: acquired at submit, finished with
prompt + output ids, released on a failure. `zllm cache ls`, near misses and explain-miss answer from it as on the
local engines. Its `cached_tokens` is zllm's view only: it sets the split Anthropic's `message_start` must report
before vLLM states it; Finished's usage is vLLM's own figure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from zllm.canonical import ChatRequest, Event, Finished, FinishReason, Usage
from zllm.diagnosis.fingerprint_store import FingerprintStore
from zllm.diagnosis.records import RequestFingerprint
from zllm.engine.vllm import wire
from zllm.engine.vllm.kv import RemoteKV, kv_bytes_per_token
from zllm.errors import EngineFailure, InvalidRequest, Overloaded
from zllm.ids import tool_call_id as new_tool_call_id
from zllm.kvcache import CacheConfig, model_key, template_hash, weights_identity
from zllm.kvcache.identity import request_namespace
from zllm.kvcache.prefix_cache import Lease, PrefixCache
from zllm.prompt import RenderedPrompt
from zllm.prompt.tokenizer_files import TokenizerFiles, read_model_json
from zllm.runtime.client_base import ClientBase, QueuedStream
from zllm.runtime.detokenizer import IncrementalDetokenizer, raw_decoder
from zllm.runtime.loop_guard import LoopGuard
from zllm.runtime.output import OutputProcessor
from zllm.runtime.report import RequestReport
from zllm.runtime.stops import StopTokens
from zllm.runtime.turn_output import PlainTextParser, TurnOutput

log = logging.getLogger("zllm.engine.vllm")

# vLLM's prefix cache works in whole blocks (--block-size; zllm starts it with 32)
BLOCK_TOKENS = 32
# how often vLLM's waiting count is read (its /metrics, ~57 KB) while zllm has requests in flight: a request that
# ends sooner never costs a read
WAITING_POLL_S = 1.0
_FINISH = {"length": FinishReason.LENGTH, "repetition": FinishReason.REPETITION, "abort": FinishReason.ABORT}


class VllmRequestStream(QueuedStream):
    def __init__(self, request_id: str, prompt_tokens: int, run: Callable[[], Any], split: asyncio.Future[Usage],
                 fingerprint: RequestFingerprint | None):
        super().__init__(request_id, prompt_tokens, asyncio.Queue(), split, fingerprint)
        self._task = asyncio.get_running_loop().create_task(run(self._events.put_nowait))

    def abort(self) -> None:
        self._task.cancel()  # closes the HTTP stream: vLLM aborts the request; run() still sends Finished(ABORT)


class VllmEngineClient(ClientBase):
    backend = "vllm"

    def __init__(self, tokenizer: TokenizerFiles, config: dict, generation_eos, *, base_url: str, served_model: str,
                 model_name: str, created: int, context_length: int, dialect: str | None = None,
                 max_queue: int = 64, fingerprints: FingerprintStore | None = None,
                 observer: Callable[[RequestReport], None] | None = None, layout: str = "",
                 session: aiohttp.ClientSession | None = None, cache_config: CacheConfig | None = None):
        """`base_url`: the vLLM server (http://host:port); `served_model`: the model name it serves;
        `context_length`: its max_model_len. `layout`: its parallel layout, for `zllm ps`. `cache_config`: the
        index of sent sequences (its `model`: the served model's key; None: no index, `prefix_cache` is None)."""
        self.base_url = base_url.rstrip("/")
        self.served_model = served_model
        self.context_length = context_length
        self.layout = layout
        self._observer = observer
        text_config = config.get("text_config") or config
        super().__init__(tokenizer, model_name=model_name, created=created, max_queue=max_queue,
                         generation_eos=generation_eos, eos_token_id=text_config.get("eos_token_id"),
                         vocab_size=int(text_config.get("vocab_size") or 0), dialect=dialect,
                         fingerprints=fingerprints)
        self._tokenizer = tokenizer
        self._session = session
        self._live: set[asyncio.Task] = set()
        self._waiting = 0  # vLLM's waiting count, as last read (queue_waiting)
        self._waiting_watch: asyncio.Task | None = None
        self._index = (PrefixCache(cache_config, RemoteKV(kv_bytes_per_token(config)), cost_key="vllm",
                                   decode=raw_decoder(tokenizer, skip_special_tokens=False))
                       if cache_config is not None and cache_config.rounds > 0 else None)
        self._model_key = cache_config.model if cache_config is not None else ""

    @classmethod
    def open(cls, model_dir: str | Path, base_url: str, *, served_model: str, name: str, created: int,
             context_length: int, **options) -> VllmEngineClient:
        """The client for `model_dir` (zllm's copy of the model vLLM serves: its tokenizer, template, config)."""
        model_dir = Path(model_dir)
        tokenizer = TokenizerFiles.from_dir(model_dir)
        config = read_model_json(model_dir / "config.json")
        eos = read_model_json(model_dir / "generation_config.json").get("eos_token_id")
        if options.get("cache_config") is not None:  # the index's namespaces are the served model's
            key = model_key(weights_identity(model_dir), "vllm", template_hash(tokenizer.chat_template))
            options["cache_config"] = replace(options["cache_config"], model=key, ssd_dir=None)
        return cls(tokenizer, config, eos, base_url=base_url, served_model=served_model, model_name=name,
                   created=created, context_length=context_length, **options)

    # ------------------------------------------------------------------ what the control layer reads

    @property
    def queue_waiting(self) -> int:
        """Requests vLLM received and has not scheduled yet (its `vllm:num_requests_waiting`; on a shared server
        other clients' too), read every WAITING_POLL_S while zllm has requests in flight; 0 when it has none."""
        return self._waiting if self._live else 0

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self._index  # zllm's index of what it sent vLLM (module docstring)

    # ------------------------------------------------------------------ EngineClient

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
                                  stop_token_ids=self.stop_token_ids | self.turn_stop_ids(request)
                                  | set(request.sampling.stop_token_ids),
                                  grammar=grammar, salt=wire.cache_salt(request.namespace), model=self.served_model)
        lease = await asyncio.get_running_loop().run_in_executor(None, self._acquire, request, ids, max_tokens)
        run = partial(self._run, request, ids, body, max_tokens, split, lease)
        stream = VllmRequestStream(request.id, len(ids), run, split, fingerprint)
        self._live.add(stream._task)
        stream._task.add_done_callback(self._live.discard)
        if lease is not None:  # a task cancelled before it ran never reaches _run's own release
            stream._task.add_done_callback(lambda _: self._index.release(lease))
        if self._waiting_watch is None or self._waiting_watch.done():
            self._waiting_watch = asyncio.get_running_loop().create_task(self._watch_waiting())
        return stream

    async def count_tokens(self, request: ChatRequest) -> int:
        self._check_model(request.model)
        render = partial(self.renderer.render, window=self.context_length)
        return len((await asyncio.get_running_loop().run_in_executor(None, render, request)).token_ids)

    async def aclose(self, timeout: float | None = 30.0) -> None:
        watch = [self._waiting_watch] if self._waiting_watch is not None else []
        for task in [*watch, *self._live]:
            task.cancel()
        if self._live or watch:
            await asyncio.wait([*self._live, *watch], timeout=timeout)
        if self._session is not None:
            await self._session.close()
        if self._index is not None:
            self._index.close()
        self.diagnosis.close()

    # ------------------------------------------------------------------ one request

    def _prepare(self, request: ChatRequest) -> tuple[RenderedPrompt, str | None, RequestFingerprint]:
        prompt = self.renderer.render(request, window=self.context_length)
        spec = self._fence_spec(request)
        grammar = self.dialect.fence_grammar(spec, self.markup) if spec.constrains else None
        if grammar is not None:
            self.fences.compile(grammar)  # InvalidRequest now, not a vLLM 400 mid-stream (compiled once, cached)
        return prompt, grammar.lark if grammar is not None else None, self.diagnosis.fingerprint(request, prompt)

    def _acquire(self, request: ChatRequest, ids: list[int], max_tokens: int) -> Lease | None:
        """The index's lease on `ids` (its lookup records a near miss, described by prompt segment). Blocking."""
        if self._index is None:
            return None
        return self._index.acquire(request_namespace(self._model_key, request.namespace), ids,
                                   hint=request.cache_hint, max_new_tokens=max_tokens, request_id=request.id,
                                   describe_position=self.diagnosis.describer(request))

    def _end_lease(self, lease: Lease | None, request: ChatRequest, sequence: list[int], reason: FinishReason | None,
                   prompt_length: int) -> None:
        """Index what vLLM now holds (prompt + output), or give the lease back when the request failed or was
        aborted (vLLM may not have kept it)."""
        if lease is None:
            return
        try:
            if reason in (FinishReason.ERROR, FinishReason.ABORT, None):
                self._index.release(lease)
            else:
                self._index.finish(lease, sequence, None, entry_id=request.id, prompt_length=prompt_length)
        except Exception:  # losing an index entry never fails the request
            log.exception("indexing %s failed", request.id)
            self._index.release(lease)

    def _output(self, request: ChatRequest, max_tokens: int) -> TurnOutput:
        text_stage = OutputProcessor(
            detokenizer=IncrementalDetokenizer(self._tokenizer, skip_special_tokens=False),
            stop_tokens=StopTokens(self.stop_token_ids | self.turn_stop_ids(request),
                                   frozenset(request.sampling.stop_token_ids)),
            stop_strings=request.sampling.stop, max_tokens=max_tokens,
            token_text=lambda token_id: self._tokenizer.decode([token_id], skip_special_tokens=False),
            hidden_ids=self.hidden_ids)
        parser = self.dialect.parser(request.tools, thinking=self.renderer.thinking(request),
                                     new_call_id=new_tool_call_id)
        return TurnOutput(text_stage, parser or PlainTextParser())

    async def _run(self, request: ChatRequest, ids: list[int], body: dict, max_tokens: int,
                   split: asyncio.Future[Usage], lease: Lease | None, emit: Callable[[Event], None]) -> None:
        """Stream one request from vLLM into `emit`; always ends with exactly one Finished."""
        started = time.perf_counter()
        # what the index says vLLM holds, in its whole blocks: the split reported before vLLM states its own
        estimate = lease.cached_tokens - lease.cached_tokens % BLOCK_TOKENS if lease is not None else 0
        output = self._output(request, max_tokens)
        guard = LoopGuard()
        generated: list[int] = []
        usage = (len(ids), 0, 0)
        reason: FinishReason | None = None
        stop_sequence = None
        first_at = None
        self._report("started", request, len(ids), lease=lease)

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
            self._end_lease(lease, request, ids if request.prefill_only else [*ids, *generated], reason, len(ids))
        self._report("finished", request, len(ids), completion=output.completion_tokens, reason=reason,
                     ttft=(first_at - started) if first_at else None, lease=lease)

    def _report(self, phase: str, request: ChatRequest, prompt: int, *, completion: int = 0,
                reason: FinishReason | None = None, ttft: float | None = None, lease: Lease | None = None) -> None:
        if self._observer is not None:
            near = lease.near_miss if lease is not None else None
            self._observer(RequestReport(phase=phase, request_id=request.id, api=request.api, model=request.model,
                                         namespace=request.namespace, prompt_tokens=prompt, prefilled_tokens=prompt,
                                         cache_tier=lease.tier if lease is not None else "off",
                                         near_miss=(f"near miss of {near.entry_id} at token {near.divergence}"
                                                    + (f" in {near.segment}" if near.segment else ""))
                                         if near is not None else None,
                                         completion_tokens=completion, ttft_s=ttft,
                                         dialect=self.dialect.name,
                                         finish_reason=reason.value if reason is not None else None))

    async def _watch_waiting(self) -> None:
        """Read vLLM's waiting count while zllm has requests in flight (queue_waiting)."""
        while True:
            await asyncio.sleep(WAITING_POLL_S)
            if not self._live:
                self._waiting = 0
                return
            try:
                async with self._http().get(self.base_url + wire.METRICS_PATH,
                                            timeout=aiohttp.ClientTimeout(total=5)) as response:
                    if response.status == 200:
                        self._waiting = wire.waiting_requests(await response.text())
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass  # a figure for `zllm status`: the requests themselves report a dead server

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # no total timeout: a long generation streams for minutes; a dead server shows as a closed connection
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self._session

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
