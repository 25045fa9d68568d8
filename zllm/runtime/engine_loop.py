"""The engine-owner thread: the one thread that touches the model, its KV caches and every torch tensor.

    asyncio side (client.py)                    engine thread (this file)
    ─────────────────────────                   ─────────────────────────
    submit(): render prompt, admit  ──queue──▶  take one EngineRequest
                                                prefill into a fresh per-request KV cache
    per-request asyncio.Queue  ◀──call_soon_──  step(): loop-guard ban → fenced sample → fence.advance →
    (RequestStream iterates it)    threadsafe          detokenize/stop → dialect parser → emit → decode forward
                                                ... until an Ending, abort, loop or error → exactly one Finished

Prefix cache (zllm/kvcache): admission looks the prompt up (device tier, then SSD) and prefills only the
suffix into a working cache over pooled buffers; after the request ends — finished or aborted, not failed —
the terminal state (prompt + every generated token that was fed forward) is kept for the next turn.

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

from zllm.canonical import Event, Finished, FinishReason, Usage
from zllm.dialects import StreamParser
from zllm.engine.kv_layers import cache_buffers, cache_state, crop_to
from zllm.engine.loader import apply_threads
from zllm.engine.runner import ModelRunner
from zllm.engine.sampler import Sampler, SamplingConfig
from zllm.errors import EngineFailure, Overloaded, ZllmError
from zllm.kvcache import Lease, PrefixCache, request_namespace
from zllm.runtime.detokenizer import IncrementalDetokenizer, raw_decoder
from zllm.runtime.fence import Fence, sample_fenced
from zllm.runtime.loop_guard import LoopGuard
from zllm.runtime.output import OutputProcessor
from zllm.runtime.prefix import working_cache_for
from zllm.runtime.report import RequestReport
from zllm.runtime.speculative import SpeculationConfig, SpeculativeStep, can_speculate
from zllm.runtime.stops import StopTokens
from zllm.runtime.turn_output import PlainTextParser, TurnOutput

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
    # the caller's cache-isolation key (canonical ChatRequest.namespace); the loop adds the model's identity
    namespace: str = ""
    # a cache entry id or client key to try first (verified against the tokens like any other match)
    cache_hint: str | None = None
    # names the prompt segment a token index falls in ("message 3 (user)"); a closure over the request that
    # renders only when called, which the prefix cache does only when it records a near miss
    describe_position: Callable[[int], str] | None = None
    # labels for observers (zllm trace) only: the loop never branches on them
    api: str = ""
    model: str = ""
    notes: tuple[str, ...] = ()
    dialect: str = ""
    fence_label: str = "off"  # what the fence constrains: "tools:auto", "json_schema", ...
    # the dialect's incremental parser for this generation (None: plain text); built by the client
    parser: StreamParser | None = None
    # the token fence (None: unconstrained) and the loop guard; per-request state, owned by the engine thread
    fence: Fence | None = None
    loop_guard: LoopGuard | None = None
    # prompt-lookup speculative decoding (None: off); off by itself for models whose cache cannot be cropped
    speculation: SpeculationConfig | None = None
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
    output: TurnOutput
    logits: torch.Tensor | None = None  # [vocab], the distribution for the next token
    lease: Lease | None = None  # the prefix cache's view of this request (None: cache off or aborted early)
    # every sampled token; the cache holds KV for all but the last one (it was never fed forward)
    generated: list[int] = field(default_factory=list)
    kept: bool = False  # whether the device tier kept the terminal state
    admitted_at: float = field(default_factory=time.perf_counter)
    looked_up_at: float | None = None  # the prefix cache answered (restore included)
    prefilled_at: float | None = None
    first_output_at: float | None = None
    fence_events: list[str] = field(default_factory=list)  # notable fence / loop-guard events, for traces
    speculative: SpeculativeStep | None = None  # the request's drafter and verifier when it speculates

    @property
    def cached_tokens(self) -> int:
        return self.lease.cached_tokens if self.lease is not None else 0

    def finished(self, reason: FinishReason, stop_sequence: str | None = None) -> Finished:
        usage = Usage(len(self.request.prompt_ids), self.output.completion_tokens, self.cached_tokens)
        return Finished(reason, usage, stop_sequence=stop_sequence)

    def terminal_sequence(self) -> tuple[int, ...]:
        """The tokens whose KV the cache holds: prompt + generated, cut to the cache length (prefill may have
        been aborted part way; the last sampled token was never fed forward)."""
        held = self.cache.get_seq_length()
        sequence = (*self.request.prompt_ids, *self.generated)
        assert held <= len(sequence), "the cache cannot hold tokens that were never seen"
        return sequence[:held]


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
        prefix_cache: PrefixCache | None = None,
        model_key: str = "",
        observer: Callable[[RequestReport], None] | None = None,
        hidden_ids: frozenset[int] = frozenset(),
    ):
        self.runner = runner
        self.prefix_cache = prefix_cache
        self._model_key = model_key  # KV compatibility identity; part of every cache namespace
        self._observer = observer  # gets a RequestReport when a request starts and when it ends
        self._hidden_ids = hidden_ids  # control tokens never streamed as text (see OutputProcessor)
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
        if self.prefix_cache is not None:
            self.prefix_cache.close()  # finishes queued SSD writes: the next start finds the last turns

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
            finished = _error_finished(request, exc, generated, active.cached_tokens if active is not None else 0)
        request.emit(finished)
        self._retire(active, finished)  # after the emit: keeping KV must not delay the client's last event
        with self._lock:
            self._live.discard(request)  # after retiring: "no live request" means the cache is settled
        _log_finished(request, finished, active)
        self._observe(request_report("finished", request, active, finished))

    def _observe(self, report: RequestReport) -> None:
        if self._observer is None:
            return
        try:
            self._observer(report)
        except Exception:  # an observer's bug must not take the loop down
            log.exception("request observer failed")

    def _run(self, active: ActiveRequest) -> Finished:
        if active.logits is None:  # aborted while queued or during prefill
            return active.finished(FinishReason.ABORT)
        while (finished := self.step(active)) is None:
            pass
        return finished

    def _admit(self, request: EngineRequest) -> ActiveRequest:
        lease = None
        if self.prefix_cache is not None and not request.aborted.is_set():
            lease = self.prefix_cache.acquire(request_namespace(self._model_key, request.namespace),
                                              request.prompt_ids, hint=request.cache_hint,
                                              max_new_tokens=request.max_tokens,
                                              describe_position=request.describe_position,
                                              request_id=request.request_id)
        try:
            active = ActiveRequest(
                request=request,
                cache=working_cache_for(self.runner, lease) if lease is not None else self.runner.new_cache(),
                sampler=Sampler(request.sampling, self.runner.device),
                output=self._output_processor(request),
                lease=lease,
            )
            active.looked_up_at = time.perf_counter()
            active.speculative = self._speculative_step(active)
            if not request.aborted.is_set():
                self._prefill(active)
                self._observe(request_report("started", request, active))
        except BaseException:
            if lease is not None:
                self.prefix_cache.release(lease)
            raise
        return active

    def _prefill(self, active: ActiveRequest) -> None:
        """Prefill what the cache did not restore (never empty: the last prompt token is always recomputed)."""
        suffix = active.request.prompt_ids[active.cached_tokens:]
        started = time.perf_counter()
        active.logits = self.runner.prefill(suffix, active.cache, should_stop=active.request.aborted.is_set)
        active.prefilled_at = time.perf_counter()
        if self.prefix_cache is not None and active.logits is not None:
            self.prefix_cache.observe_prefill(len(suffix), active.prefilled_at - started)

    def _retire(self, active: ActiveRequest | None, finished: Finished) -> None:
        """Hand the terminal state to the prefix cache (or just return the lease when the request failed: a
        forward that raised may have updated some layers and not others)."""
        if active is None or active.lease is None:
            return
        buffers = cache_buffers(active.cache)
        try:
            if finished.reason is FinishReason.ERROR:
                self.prefix_cache.release(active.lease, buffers)
                return
            active.kept = self.prefix_cache.finish(
                active.lease, active.terminal_sequence(), cache_state(active.cache),
                entry_id=active.request.request_id, prompt_length=len(active.request.prompt_ids), buffers=buffers)
        except Exception:  # losing a cache entry must never take the loop down
            log.exception("keeping the KV of %s failed", active.request.request_id)
            self.prefix_cache.release(active.lease, buffers)

    def step(self, active: ActiveRequest) -> Finished | None:
        """One decode round: sample, stream its text, run the next forward. Returns Finished at the end."""
        if active.request.aborted.is_set():
            return active.finished(FinishReason.ABORT)
        if active.speculative is not None:
            return self._speculative_round(active)
        request = active.request
        if request.loop_guard is not None:
            request.loop_guard.ban(active.logits, request.fence)  # the token that would continue a loop
        # within the fence: grammar-invalid tokens are never chosen (masked only when the first draw strays)
        token = sample_fenced(active.sampler, active.logits, request.fence)  # [1, 1] on the device
        if (finished := self._emit(active, token.item())) is not None:  # the one host sync per token
            return finished
        active.logits = self.runner.decode(token, active.cache)
        return None

    def _speculative_round(self, active: ActiveRequest) -> Finished | None:
        """One verify forward (runtime/speculative.py) emits 1..k+1 tokens, each streamed as a plain step's."""
        request = active.request
        run = active.speculative.step(active.logits, active.cache, fence=request.fence, loop_guard=request.loop_guard,
                                      remaining=request.max_tokens - active.output.completion_tokens)
        for token_id in run.tokens:
            if (finished := self._emit(active, token_id)) is not None:
                # tokens after the ending were fed forward: keep what a plain loop's cache holds (prompt and
                # every emitted token but the last), which is what terminal_sequence() hands the prefix cache
                crop_to(active.cache, len(request.prompt_ids) + len(active.generated) - 1)
                return finished
        assert run.logits is not None, "a run without a forward ends the request (stop token or last token)"
        active.logits = run.logits
        return None

    def _emit(self, active: ActiveRequest, token_id: int) -> Finished | None:
        """Everything after sampling one token: record it, advance the fence, stream its events, end the request
        on a stop, the budget or a loop. Returns Finished when the request is over."""
        request = active.request
        active.generated.append(token_id)
        if request.fence is not None:
            request.fence.advance(token_id)
        events, ending = active.output.accept(token_id)
        if events and active.first_output_at is None:
            active.first_output_at = time.perf_counter()
        for event in events:
            request.emit(event)
        if ending is None and request.loop_guard is not None and self._loops(active, token_id, events):
            for event in active.output.close():
                request.emit(event)
            return active.finished(FinishReason.REPETITION)
        if ending is not None:
            return active.finished(ending.reason, ending.stop_sequence)
        return None

    def _speculative_step(self, active: ActiveRequest) -> SpeculativeStep | None:
        request = active.request
        if request.speculation is None or not can_speculate(active.cache):
            return None
        return SpeculativeStep(self.runner, active.sampler, request.prompt_ids, request.speculation,
                               stop_token_ids=self._stop_ids(request))

    def _stop_ids(self, request: EngineRequest) -> frozenset[int]:
        """Every token id the output path ends a request on (see StopTokens)."""
        return self._model_stops(request) | request.stop_token_ids

    def _model_stops(self, request: EngineRequest) -> frozenset[int]:
        return self._model_stop_ids if request.use_model_stop_tokens else frozenset()

    @staticmethod
    def _loops(active: ActiveRequest, token_id: int, events: list[Event]) -> bool:
        """Feed the loop guard; True when it says the generation is stuck (and logs why)."""
        guard = active.request.loop_guard
        guard.observe(token_id)
        for name, arguments in active.output.completed_calls(events):
            guard.observe_call(name, arguments)
        verdict = guard.verdict()
        if verdict is not None:
            active.fence_events.append(f"loop guard: {verdict.detail}")
            log.info("%s stopped by the loop guard: %s", active.request.request_id, verdict.detail)
        return verdict is not None

    def _output_processor(self, request: EngineRequest) -> TurnOutput:
        text_stage = OutputProcessor(
            # special tokens stay in the text (a dialect's <think> may be one); hidden_ids drops control tokens
            detokenizer=IncrementalDetokenizer(self._tokenizer, skip_special_tokens=False),
            stop_tokens=StopTokens(self._model_stops(request), request.stop_token_ids),
            stop_strings=request.stop_strings,
            max_tokens=request.max_tokens,
            token_text=lambda token_id: self._token_text([token_id]),
            hidden_ids=self._hidden_ids,
        )
        return TurnOutput(text_stage, request.parser or PlainTextParser())


def _log_finished(request: EngineRequest, finished: Finished, active: ActiveRequest | None) -> None:
    """One line per request, for people reading the daemon log (and for tests of abort/finish)."""
    usage = finished.usage
    timing = ""
    if active is not None and active.prefilled_at is not None:
        prefill_s = active.prefilled_at - active.admitted_at  # restore included: it is part of the TTFT
        decode_s = time.perf_counter() - active.prefilled_at
        decode_rate = usage.completion_tokens / decode_s if decode_s > 0 else 0.0
        prefilled = usage.prompt_tokens - usage.cached_tokens
        timing = f" prefill {prefill_s:.2f}s ({prefilled / max(prefill_s, 1e-9):.0f} tok/s), decode {decode_rate:.1f} tok/s"
    cache = "cache off"
    if active is not None and active.lease is not None:
        cache = f"{usage.cached_tokens} cached ({active.lease.tier}){', kept' if active.kept else ''}"
        if (miss := active.lease.near_miss) is not None:
            cache += f", near miss of {miss.entry_id} at token {miss.divergence}"
            cache += f" in {miss.segment}" if miss.segment else ""
    log.info(
        "%s finished: %s, prompt %d tok, %s, output %d tok%s",
        request.request_id, finished.reason.value, usage.prompt_tokens, cache, usage.completion_tokens, timing,
    )


def request_report(phase: str, request: EngineRequest, active: ActiveRequest | None,
                   finished: Finished | None = None) -> RequestReport:
    """Plain-data view of a request for observers (see report.py)."""
    lease = active.lease if active is not None else None
    usage = finished.usage if finished is not None else None
    timing: dict = {}
    if active is not None:
        if active.looked_up_at is not None:
            timing["restore_s"] = active.looked_up_at - active.admitted_at
        if active.prefilled_at is not None:
            timing["prefill_s"] = active.prefilled_at - active.admitted_at
            decode_s = time.perf_counter() - active.prefilled_at
            if finished is not None and decode_s > 0:
                timing["decode_tok_s"] = usage.completion_tokens / decode_s
        if active.first_output_at is not None:
            timing["ttft_s"] = active.first_output_at - active.admitted_at
    near = lease.near_miss if lease is not None else None
    return RequestReport(
        phase=phase, request_id=request.request_id, api=request.api, model=request.model,
        namespace=request.namespace, prompt_tokens=len(request.prompt_ids),
        cached_tokens=active.cached_tokens if active is not None else 0,
        cache_tier=lease.tier if lease is not None else "off",
        completion_tokens=usage.completion_tokens if usage is not None else 0,
        finish_reason=finished.reason.value if finished is not None else None,
        error=finished.error_message if finished is not None else None,
        near_miss=(f"near miss of {near.entry_id} at token {near.divergence}"
                   + (f" in {near.segment}" if near.segment else "")) if near is not None else None,
        notes=request.notes, dialect=request.dialect, fence=request.fence_label,
        fence_events=tuple(active.fence_events) if active is not None else (),
        tool_calls=tuple(active.output.call_names.values()) if active is not None else (), **timing)


def _error_finished(request: EngineRequest, exc: Exception, completion_tokens: int, cached_tokens: int) -> Finished:
    log.exception("request %s failed", request.request_id)
    code = exc.code if isinstance(exc, ZllmError) else EngineFailure.code
    message = exc.message if isinstance(exc, ZllmError) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, torch.OutOfMemoryError):
        message = f"out of memory while running the request: {exc}"
        torch.cuda.empty_cache()
    usage = Usage(len(request.prompt_ids), completion_tokens, cached_tokens)
    return Finished(FinishReason.ERROR, usage, error_code=code, error_message=message)
