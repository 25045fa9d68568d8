"""The engine-owner thread: the one thread that touches the model, its KV caches and every torch tensor.

    asyncio side (client.py)                    engine thread (this file)
    ─────────────────────────                   ─────────────────────────
    submit(): render prompt, admit  ──queue──▶  take one EngineRequest
                                                prefill into a fresh per-request KV cache
    per-request asyncio.Queue  ◀──call_soon_──  step(): sample → detokenize/stop → emit → decode forward
    (RequestStream iterates it)    threadsafe   ... until an Ending, abort or error → exactly one Finished

One request runs at a time for now (continuous batching is a later issue: `step()` then advances a batch).
An abort is a per-request flag read once per decode step; a request aborted while still queued ends with
ABORT without running. Any exception inside a request ends *that* request with ERROR; the loop keeps serving.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from zllm.canonical import Event, Finished, FinishReason, TextDelta, Usage
from zllm.engine.loader import apply_threads
from zllm.engine.runner import ModelRunner
from zllm.engine.sampler import Sampler, SamplingConfig
from zllm.errors import EngineFailure, Overloaded, ZllmError
from zllm.runtime.detokenizer import IncrementalDetokenizer, raw_decoder
from zllm.runtime.output import OutputProcessor
from zllm.runtime.stops import StopTokens

log = logging.getLogger("zllm.runtime")


@dataclass(eq=False)
class EngineRequest:
    """An admitted request as the engine sees it: token ids and limits, no protocol, no messages."""

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingConfig
    max_tokens: int  # already clamped to the room left in the context window
    # receives every event; called on the engine thread, so it must hand off (call_soon_threadsafe)
    sink: Callable[[Event], None]
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    # False only for benchmarks that must decode a fixed number of tokens (model EOS ignored)
    use_model_stop_tokens: bool = True
    aborted: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        assert self.prompt_ids and self.max_tokens >= 1, "the client validates prompt and budget"

    def abort(self) -> None:
        self.aborted.set()

    def emit(self, event: Event) -> None:
        try:
            self.sink(event)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
            self.abort()


@dataclass(eq=False)
class ActiveRequest:
    """Engine-thread state of the running request. The KV cache is an explicit per-request object so the
    prefix-cache issue can keep it after the request ends."""

    request: EngineRequest
    cache: DynamicCache
    sampler: Sampler
    output: OutputProcessor
    logits: torch.Tensor | None = None  # [vocab], the distribution for the next token
    admitted_at: float = field(default_factory=time.perf_counter)
    prefilled_at: float | None = None

    def finished(self, reason: FinishReason, stop_sequence: str | None = None) -> Finished:
        usage = Usage(len(self.request.prompt_ids), self.output.completion_tokens)
        return Finished(reason, usage, stop_sequence=stop_sequence)


_SHUTDOWN = object()


class EngineLoop:
    def __init__(
        self,
        runner: ModelRunner,
        tokenizer,
        model_stop_ids: frozenset[int],
        *,
        threads: int = 0,
        name: str = "zllm-engine",
    ):
        self.runner = runner
        self._tokenizer = tokenizer
        self._token_text = raw_decoder(tokenizer, skip_special_tokens=False)
        self._model_stop_ids = model_stop_ids
        self._threads = threads
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live: set[EngineRequest] = set()  # submitted and not yet finished
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    # ------------------------------------------------------------------ any thread

    def start(self) -> None:
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Requests queued and not yet picked up by the engine thread."""
        return self._queue.qsize()

    def submit(self, request: EngineRequest) -> None:
        with self._lock:
            if self._closed:
                raise Overloaded("the engine is shutting down", hint="retry against a running daemon")
            self._live.add(request)
        self._queue.put(request)

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Abort every live request (each still gets its Finished(ABORT)), then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live = list(self._live)
        for request in live:
            request.abort()
        self._queue.put(_SHUTDOWN)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ engine thread

    def _main(self) -> None:
        apply_threads(self._threads)  # torch's thread count is per OS thread
        with torch.inference_mode():
            while (request := self._queue.get()) is not _SHUTDOWN:
                self._serve(request)

    def _serve(self, request: EngineRequest) -> None:
        active: ActiveRequest | None = None
        try:
            active = self._admit(request)
            finished = self._run(active)
        except Exception as exc:  # one request's failure must not take the loop down
            generated = active.output.completion_tokens if active is not None else 0
            finished = _error_finished(request, exc, generated)
        request.emit(finished)
        with self._lock:
            self._live.discard(request)
        _log_finished(request, finished, active)

    def _run(self, active: ActiveRequest) -> Finished:
        if active.logits is None:  # aborted while queued or during prefill
            return active.finished(FinishReason.ABORT)
        while (finished := self.step(active)) is None:
            pass
        return finished

    def _admit(self, request: EngineRequest) -> ActiveRequest:
        active = ActiveRequest(
            request=request,
            cache=self.runner.new_cache(),
            sampler=Sampler(request.sampling, self.runner.device),
            output=self._output_processor(request),
        )
        if not request.aborted.is_set():
            active.logits = self.runner.prefill(request.prompt_ids, active.cache, should_stop=request.aborted.is_set)
            active.prefilled_at = time.perf_counter()
        return active

    def step(self, active: ActiveRequest) -> Finished | None:
        """One decode round: sample, stream its text, run the next forward. Returns Finished at the end."""
        if active.request.aborted.is_set():
            return active.finished(FinishReason.ABORT)
        token = active.sampler(active.logits)  # [1, 1] on the device
        text, ending = active.output.accept(token.item())  # the one host sync per token
        if text:
            active.request.emit(TextDelta(text))
        if ending is not None:
            return active.finished(ending.reason, ending.stop_sequence)
        active.logits = self.runner.decode(token, active.cache)
        return None

    def _output_processor(self, request: EngineRequest) -> OutputProcessor:
        model_ids = self._model_stop_ids if request.use_model_stop_tokens else frozenset()
        return OutputProcessor(
            detokenizer=IncrementalDetokenizer(self._tokenizer),
            stop_tokens=StopTokens(model_ids, request.stop_token_ids),
            stop_strings=request.stop_strings,
            max_tokens=request.max_tokens,
            token_text=lambda token_id: self._token_text([token_id]),
        )


def _log_finished(request: EngineRequest, finished: Finished, active: ActiveRequest | None) -> None:
    """One line per request, for people reading the daemon log (and for tests of abort/finish)."""
    usage = finished.usage
    timing = ""
    if active is not None and active.prefilled_at is not None:
        prefill_s = active.prefilled_at - active.admitted_at
        decode_s = time.perf_counter() - active.prefilled_at
        decode_rate = usage.completion_tokens / decode_s if decode_s > 0 else 0.0
        timing = f" prefill {prefill_s:.2f}s ({usage.prompt_tokens / max(prefill_s, 1e-9):.0f} tok/s), decode {decode_rate:.1f} tok/s"
    log.info(
        "%s finished: %s, prompt %d tok, output %d tok%s",
        request.request_id, finished.reason.value, usage.prompt_tokens, usage.completion_tokens, timing,
    )


def _error_finished(request: EngineRequest, exc: Exception, completion_tokens: int) -> Finished:
    log.exception("request %s failed", request.request_id)
    code = exc.code if isinstance(exc, ZllmError) else EngineFailure.code
    message = exc.message if isinstance(exc, ZllmError) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, torch.OutOfMemoryError):
        message = f"out of memory while running the request: {exc}"
        torch.cuda.empty_cache()
    usage = Usage(len(request.prompt_ids), completion_tokens)
    return Finished(FinishReason.ERROR, usage, error_code=code, error_message=message)
