"""What the engine thread knows about a request: `EngineRequest` (admitted: token ids, limits, sinks — no
protocol, no messages) and `ActiveRequest` (a running row: its KV cache, sampler, output path, timings), plus
the plain-data reports and log lines made from them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from zllm.canonical import Event, Finished, FinishReason, Usage
from zllm.dialects import StreamParser
from zllm.engine.contract import Logits
from zllm.engine.sampler import Sampler, SamplingConfig
from zllm.errors import EngineFailure, ZllmError
from zllm.kvcache.contract import CacheLease
from zllm.runtime.fence import Fence
from zllm.runtime.loop_guard import LoopGuard
from zllm.runtime.report import RequestReport
from zllm.runtime.speculative import SpeculationConfig, SpeculativeStep
from zllm.runtime.turn_output import TurnOutput

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
    # receives the prompt's cache split once, as soon as it is known (see report_prompt); engine thread, hands off
    prompt_sink: Callable[[Usage], None] | None = None
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    # end-of-turn ids this request adds to the model's (a finish reason of "stop", not a stop sequence): the
    # dialect's marker that ends a turn of text where no call can follow (ClientBase.turn_stop_ids)
    turn_stop_ids: frozenset[int] = frozenset()
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
    # end as soon as the prompt is prefilled (Finished PREFILLED), before sampling anything; the prefix cache
    # keeps the prompt as it keeps any finished request's terminal state
    prefill_only: bool = False
    aborted: threading.Event = field(default_factory=threading.Event)
    submitted_at: float = field(default_factory=time.perf_counter)  # queue wait counts in the TTFT
    prompt_reported: bool = False  # engine thread: report_prompt already ran

    def __post_init__(self) -> None:
        assert self.prompt_ids and self.max_tokens >= 1, "the client validates prompt and budget"

    def abort(self) -> None:
        self.aborted.set()

    def report_prompt(self, usage: Usage) -> None:
        """Hand the prompt's split (cached / to be kept / completion 0) to `prompt_sink`, the first time only:
        the loop reports it when the row begins (the cache has answered) and again, as a no-op, with Finished,
        so a request that never began still gets one before its Finished."""
        if self.prompt_reported or self.prompt_sink is None:
            return
        self.prompt_reported = True
        try:
            self.prompt_sink(replace(usage, completion_tokens=0))
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
            self.abort()

    def emit(self, event: Event) -> None:
        try:
            self.sink(event)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
            self.abort()


@dataclass(eq=False)
class ActiveRequest:
    """Engine-thread state of one running row: its own KV cache (kept by the prefix cache when the request
    ends), sampler, output path and timings. `logits` None: the prompt is still being prefilled (the cache holds
    a prefix of it), or the request was aborted before its prefill ended."""

    request: EngineRequest
    cache: object  # the engine's sequence (engine/contract.py): a DynamicCache, a llama.cpp sequence
    sampler: Sampler
    output: TurnOutput
    logits: Logits | None = None  # [vocab], the distribution for the next token
    lease: CacheLease | None = None  # the prefix cache's view of this request (None: cache off or aborted early)
    # every sampled token; the cache holds KV for all but the last one (it was never fed forward)
    generated: list[int] = field(default_factory=list)
    kept: bool = False  # whether the device tier kept the terminal state
    # whether the terminal state is offered to a prefix cache that keeps conversations (known at admission;
    # `kept` is known only after the last event went out)
    keeps: bool = False
    admitted_at: float = field(default_factory=time.perf_counter)
    looked_up_at: float | None = None  # the prefix cache answered (restore included)
    prefilled_at: float | None = None
    first_output_at: float | None = None
    prefill_forward_s: float = 0.0  # time in the forwards that carried this row's prefill chunks
    progress_reported_at: float | None = None  # the last "prefilling" report (None: none yet)
    fence_events: list[str] = field(default_factory=list)  # notable fence / loop-guard events, for traces
    speculative: SpeculativeStep | None = None  # the request's drafter and verifier when it speculates

    @property
    def cached_tokens(self) -> int:
        return self.lease.cached_tokens if self.lease is not None else 0

    def prompt_usage(self, completion_tokens: int = 0) -> Usage:
        """The prompt's split, fixed once the row begins (the lease's restored length no longer changes):
        what message_start reports and what Finished repeats."""
        prompt = len(self.request.prompt_ids)
        written = prompt - self.cached_tokens if self.keeps else 0
        return Usage(prompt, completion_tokens, self.cached_tokens, cache_write_tokens=written)

    def finished(self, reason: FinishReason, stop_sequence: str | None = None) -> Finished:
        return Finished(reason, self.prompt_usage(self.output.completion_tokens), stop_sequence=stop_sequence)

    def terminal_sequence(self, held: int) -> tuple[int, ...]:
        """The tokens whose KV the cache holds (`held` of them): prompt + generated, cut to the cache length
        (prefill may have been aborted part way; the last sampled token was never fed forward)."""
        sequence = (*self.request.prompt_ids, *self.generated)
        assert held <= len(sequence), "the cache cannot hold tokens that were never seen"
        return sequence[:held]

    def terminal_prompt_length(self, held: int) -> int:
        """How much of the kept sequence is prompt: all of the prompt, or — a prefill aborted part way — only
        the `held` tokens whose KV exists. The one place both cache backends get this from: an entry (and its
        SSD row) claiming more prompt than it holds is not a valid entry (ssd_index.SnapshotRow refuses it)."""
        return min(len(self.request.prompt_ids), held)


def log_finished(request: EngineRequest, finished: Finished, active: ActiveRequest | None) -> None:
    """One line per request, for people reading the daemon log (and for tests of abort/finish)."""
    usage = finished.usage
    timing = ""
    if active is not None and active.prefilled_at is not None:
        prefill_s = active.prefilled_at - active.admitted_at  # restore included: it is part of the TTFT
        decode_s = time.perf_counter() - active.prefilled_at
        decode_rate = usage.completion_tokens / decode_s if decode_s > 0 else 0.0
        prefilled = usage.prompt_tokens - usage.cached_tokens
        prefill_rate = prefilled / max(prefill_s, 1e-9)
        timing = f" prefill {prefill_s:.2f}s ({prefill_rate:.0f} tok/s), decode {decode_rate:.1f} tok/s"
    cache = "cache off"
    if active is not None and active.lease is not None:
        cache = f"{usage.cached_tokens} cached ({active.lease.tier}){', kept' if active.kept else ''}"
        if (rejected := active.lease.rejected) is not None:
            cache += f", {rejected}"
        if (miss := active.lease.near_miss) is not None:
            cache += f", near miss of {miss.entry_id} at token {miss.divergence}"
            cache += f" in {miss.segment}" if miss.segment else ""
    log.info(
        "%s finished: %s, prompt %d tok, %s, output %d tok%s",
        request.request_id, finished.reason.value, usage.prompt_tokens, cache, usage.completion_tokens, timing,
    )


def request_report(phase: str, request: EngineRequest, active: ActiveRequest | None,
                   finished: Finished | None = None, *, prefilled_tokens: int | None = None) -> RequestReport:
    """Plain-data view of a request for observers (see report.py). `prefilled_tokens`: the prompt tokens its
    cache holds (None: the whole prompt once the prefill ended, else what was restored)."""
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
            timing["ttft_s"] = active.first_output_at - request.submitted_at
    near = lease.near_miss if lease is not None else None
    return RequestReport(
        phase=phase, request_id=request.request_id, api=request.api, model=request.model,
        namespace=request.namespace, prompt_tokens=len(request.prompt_ids),
        cached_tokens=active.cached_tokens if active is not None else 0,
        prefilled_tokens=prefilled_tokens if prefilled_tokens is not None else _prefilled(request, active),
        cache_tier=lease.tier if lease is not None else "off",
        completion_tokens=usage.completion_tokens if usage is not None else 0,
        finish_reason=finished.reason.value if finished is not None else None,
        error=finished.error_message if finished is not None else None,
        near_miss=(f"near miss of {near.entry_id} at token {near.divergence}"
                   + (f" in {near.segment}" if near.segment else "")) if near is not None else None,
        cache_rejected=lease.rejected if lease is not None else None,
        notes=request.notes, dialect=request.dialect, fence=request.fence_label,
        fence_events=tuple(active.fence_events) if active is not None else (),
        tool_calls=tuple(active.output.call_names.values()) if active is not None else (),
        **_speculation_counts(active), **timing)


def _prefilled(request: EngineRequest, active: ActiveRequest | None) -> int:
    if active is None:
        return 0
    return len(request.prompt_ids) if active.prefilled_at is not None else active.cached_tokens


def _speculation_counts(active: ActiveRequest | None) -> dict[str, int]:
    if active is None or active.speculative is None:
        return {}
    stats = active.speculative.stats
    return {"drafted_tokens": stats.drafted, "accepted_tokens": stats.accepted}


ENGINE_FAILED_MESSAGE = "the engine failed while running the request (details are in the zllm daemon log)"
OUT_OF_MEMORY_MESSAGE = "out of memory while running the request (details are in the zllm daemon log)"


def error_finished(request: EngineRequest, exc: Exception, completion_tokens: int, cached_tokens: int,
                   out_of_memory: bool = False) -> Finished:
    """`out_of_memory`: the backend says `exc` is its device running out (engine/loaded.py)."""
    log.exception("request %s failed", request.request_id)
    code = exc.code if isinstance(exc, ZllmError) else EngineFailure.code
    # the client gets what happened, never the exception's text: that is for the log (above)
    message = exc.message if isinstance(exc, ZllmError) else ENGINE_FAILED_MESSAGE
    if out_of_memory:
        message = OUT_OF_MEMORY_MESSAGE
    usage = Usage(len(request.prompt_ids), completion_tokens, cached_tokens)
    return Finished(FinishReason.ERROR, usage, error_code=code, error_message=message)
