"""The engine-owner thread: the one thread that touches the model, its KV caches and every logits array.

    asyncio side (client.py)                    engine thread (this file)
    ─────────────────────────                   ─────────────────────────
    submit(): render prompt, admit  ──queue──▶  waiting line → admitted as a row when it fits (scheduler.py)
                                                each step, for every row:
    per-request asyncio.Queue  ◀──call_soon_──    decoding: loop-guard ban → fenced sample → fence.advance →
    (RequestStream iterates it)    threadsafe       detokenize/stop → dialect parser → emit → its token
                                                  (or a speculative draft) joins the step's forward
                                                  prefilling: a chunk of its prompt joins the step's forward
                                                one forward for all rows (engine/torch/packed.py), each row on its
                                                own KV cache; rows leave when they end, waiting ones join

Continuous batching: rows start from different cache states (cold, a device hit, an SSD restore), keep their
own positions, sampling, stops, fence and loop guard, and are sampled one by one after the shared forward —
batching changes which forward computes a row's logits, never how its tokens are chosen.

Prefix cache (zllm/kvcache): admission looks the prompt up (device tier, then SSD) and prefills only the
suffix into a working cache over pooled buffers; after the request ends — finished or aborted, not failed —
the terminal state (prompt + every generated token that was fed forward) is kept for the next turn.

A prefill-only request (a cache prewarm) is a row like any other until its prompt is prefilled; it then ends
with PREFILLED instead of sampling, and its prompt is kept like a finished request's terminal state. A request
that continues a prewarm still prefilling takes its prefill over (`_hand_over_prewarms`).

An abort is a per-request flag read at every step: the row leaves at the next step and its memory goes back
(a request aborted while waiting ends with ABORT without running). An exception in one row's sampling or
output ends that row with ERROR; one in the shared forward ends the rows in it (their caches may be half
updated). The loop keeps serving.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any
from collections.abc import Callable
from functools import partial

from zllm.canonical import Event, Finished, FinishReason, Usage
from zllm.engine.contract import Engine, Logits, Row
from zllm.engine.loaded import DraftModel
from zllm.engine.sampler import Sampler
from zllm.errors import Overloaded
from zllm.kvcache import request_namespace
from zllm.kvcache.contract import CacheLease, KVPrefixCache
from zllm.runtime.active import ActiveRequest, EngineRequest, error_finished, log_finished, request_report
from zllm.runtime.detokenizer import IncrementalDetokenizer, raw_decoder
from zllm.runtime.fence import sample_fenced
from zllm.runtime.output import OutputProcessor
from zllm.runtime.report import RequestReport
from zllm.runtime.restores import Restores
from zllm.runtime.scheduler import SchedulerConfig, WaitingLine, WaitingRequest, plan_admission, plan_prefill
from zllm.runtime.speculative import DraftPlan, SpeculativeRun, SpeculativeStep
from zllm.runtime.stops import StopTokens
from zllm.runtime.turn_output import PlainTextParser, TurnOutput

__all__ = ["ActiveRequest", "EngineLoop", "EngineRequest"]

log = logging.getLogger("zllm.runtime")

# a prefill longer than this reports its progress to observers about this often (zllm status / trace)
PROGRESS_REPORT_S = 1.0

_SHUTDOWN = object()
_WAKE = object()  # a restore finished: look at the restores again

# a prewarm's prompt ends with the generation prompt its template adds after the last message, which the next
# turn renders differently (its history continues with the answer): a request that shares all of a prewarm's
# prompt but at most this many tokens continues it (continues_prewarm)
PREWARM_TAIL_TOKENS = 32

# what a row hands the step: its tokens for the shared forward and what to do with its logits afterwards
# (the callback returns Finished when the row ended)
Work = tuple[Row, Callable[[Logits], Finished | None]]


class EngineLoop:
    def __init__(
        self,
        runner: Engine,
        tokenizer,
        model_stop_ids: frozenset[int],
        *,
        threads: int = 0,
        name: str = "zllm-engine",
        prefix_cache: KVPrefixCache[Any] | None = None,
        model_key: str = "",
        observer: Callable[[RequestReport], None] | None = None,
        hidden_ids: frozenset[int] = frozenset(),
        scheduler: SchedulerConfig | None = None,
        draft_model: DraftModel | None = None,
        out_of_memory: Callable[[BaseException], bool] = lambda exc: False,
    ):
        self.engine = runner  # the engine seam (engine/contract.py): torch or llama.cpp
        self.prefix_cache = prefix_cache
        self.scheduler = scheduler or SchedulerConfig()
        self.draft_model = draft_model  # drafts for speculating requests instead of prompt lookup
        self._model_key = model_key  # KV compatibility identity; part of every cache namespace
        self._observer = observer  # gets a RequestReport when a request starts and when it ends
        self._hidden_ids = hidden_ids  # control tokens never streamed as text (see OutputProcessor)
        self._tokenizer = tokenizer
        self._token_text = raw_decoder(tokenizer, skip_special_tokens=False)
        self._model_stop_ids = model_stop_ids
        self._threads = threads
        self._out_of_memory = out_of_memory  # the backend's: whether an exception says its device ran out
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live: set[EngineRequest] = set()  # submitted and not yet finished
        self._closed = False
        self._stopping = False  # engine thread: the shutdown marker arrived
        self._line = WaitingLine()  # engine thread: submitted, not yet running
        self._rows: list[ActiveRequest] = []  # engine thread: running (prefilling or decoding)
        self._restores = Restores(wake=lambda: self._queue.put(_WAKE))  # engine thread: reading from SSD
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    # ------------------------------------------------------------------ any thread

    def start(self) -> None:
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet running."""
        return self._queue.qsize() + len(self._line)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def running(self) -> int:
        return len(self._rows)

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

    # ------------------------------------------------------------------ engine thread: the loop

    def _main(self) -> None:
        try:
            with self.engine.engine_thread(self._threads):  # torch: its per-thread count, inference mode
                while self._receive():
                    self._join_restored()
                    self._end_aborted()  # before admission: see _end_aborted
                    self._hand_over_prewarms()  # likewise
                    self._admit_waiting()
                    if self._rows:
                        self._step()
        finally:
            self._restores.close()

    def _receive(self) -> bool:
        """Move submitted requests to the waiting line (blocking only when there is nothing else to do).
        False when the loop is done: shutting down and every request has ended."""
        # with nothing running, wait for a request, or for a restore to finish (it wakes the queue)
        block = not self._rows and not self._stopping and (not len(self._line) or len(self._restores) > 0)
        while True:
            try:
                item = self._queue.get(block=block)
            except queue.Empty:
                break
            block = False
            if item is _SHUTDOWN:
                self._stopping = True
            elif item is not _WAKE:
                self._line.add(item)
        return not (self._stopping and not self._rows and not len(self._line) and not len(self._restores))

    def _end_aborted(self) -> None:
        """End the rows whose request was aborted, keeping what they computed, before any waiting request is
        admitted. A client that gives up on a slow prefill retries with the same prompt at once (Claude Code
        does): the hang-up sets the old request's abort flag right away, but its row leaves only between steps,
        and the retry arrives while the step in flight runs. Ending aborted rows first means the retry's cache
        lookup, which admission makes, finds the aborted prefill's kept prefix (everything up to the step that
        was in flight) instead of racing it and finding the older prefix that request started from. The retry
        waits for no more than the step it would have waited for anyway."""
        for active in [a for a in self._rows if a.request.aborted.is_set()]:
            self._end(active, active.finished(FinishReason.ABORT))

    def _hand_over_prewarms(self) -> None:
        """End a prefill-only row still prefilling, keeping what it computed, when a waiting request continues
        its prompt (see `continues_prewarm`): the client warmed the next turn and sent that turn before the
        warm-up was done. Left running, the prewarm and the turn would prefill the same prefix side by side, each
        at half the speed, and the turn would find nothing cached; ended first, as `_end_aborted` ends an
        aborted row, the turn's lookup finds the prefix computed so far and its own prefill does the rest once.
        The prewarm answers PREFILLED with the whole prompt as written: the turn that continues it keeps it."""
        prewarms = [a for a in self._rows if a.request.prefill_only and a.logits is None]
        if not prewarms or not len(self._line):
            return
        for request in self._line.candidates():
            for active in [a for a in prewarms if a in self._rows]:
                if continues_prewarm(request, active.request, self.engine.length(active.cache)):
                    log.info("%s continues the prewarm %s: it takes over its prefill", request.request_id,
                             active.request.request_id)
                    self._end(active, active.finished(FinishReason.PREFILLED))

    def _admit_waiting(self) -> None:
        """Carry out the scheduler's admission (scheduler.plan_admission) over the waiting line."""
        cache = self.prefix_cache
        waiting = [WaitingRequest(request, self._line.waited(request), request.aborted.is_set(),
                                  cache.admission_need(len(request.prompt_ids), request.max_tokens) if cache else 0)
                   for request in self._line.candidates()]
        admission = plan_admission(self.scheduler, waiting, running=len(self._rows) + len(self._restores),
                                   room=cache.admission_room() if cache is not None else None)
        for request in admission.drop:
            self._line.remove(request)
            self._finish(request, Finished(FinishReason.ABORT, Usage(len(request.prompt_ids), 0, 0)))
        for request in admission.start:
            self._line.remove(request)
            self._start(request)

    def _start(self, request: EngineRequest) -> None:
        """Look `request`'s prompt up in the prefix cache: a device hit (or a miss) makes it a row now; a prefix
        worth reading from SSD is read on the restore thread first (runtime/restores.py), and the row starts
        when the read is done (`_join_restored`). Its prefill runs in the following steps."""
        lease = None
        try:
            if self.prefix_cache is not None:
                lease = self.prefix_cache.acquire(request_namespace(self._model_key, request.namespace),
                                                  request.prompt_ids, hint=request.cache_hint,
                                                  max_new_tokens=request.max_tokens,
                                                  describe_position=request.describe_position,
                                                  request_id=request.request_id, defer=True)
                if lease.diagnose is not None:
                    self._restores.diagnose(partial(self.prefix_cache.diagnose, lease))
                if lease.pending is not None:
                    self._restores.start(request, lease, self.prefix_cache.read_ssd)
                    return
            self._begin(request, lease, time.perf_counter())
        except Exception as exc:
            self._fail_start(request, lease, exc)

    def _join_restored(self) -> None:
        """Rows for the requests whose SSD read finished (a rejected snapshot: they start from what the device
        tier gave; a request aborted meanwhile starts and ends at the next step, keeping its restored prefix)."""
        for request, lease, admitted_at, outcome in self._restores.ready():
            try:
                self.prefix_cache.complete_ssd(lease, outcome)
                self._begin(request, lease, admitted_at)
            except Exception as exc:
                self._fail_start(request, lease, exc)

    def _begin(self, request: EngineRequest, lease: CacheLease | None, admitted_at: float) -> None:
        active = ActiveRequest(
            request=request,
            cache=self.engine.open(lease),
            sampler=Sampler(request.sampling, self.engine.device),
            output=self._output_processor(request),
            lease=lease,
            keeps=lease is not None and self.prefix_cache.keeps_state,
            admitted_at=admitted_at,
        )
        active.looked_up_at = time.perf_counter()
        active.speculative = self._speculative_step(active)
        self._rows.append(active)
        request.report_prompt(active.prompt_usage())  # the cache has answered: the split is known
        if self._prompt_left(active) > self.scheduler.prefill_chunk:  # a prefill of several steps: show it
            self._report_progress(active)

    def _fail_start(self, request: EngineRequest, lease: CacheLease | None, exc: Exception) -> None:
        if lease is not None:
            self.prefix_cache.release(lease)
        self._finish(request, error_finished(request, exc, 0, 0, self._out_of_memory(exc)))

    def _step(self) -> None:
        """One forward for every row: decoding rows sample first (their token is what they feed), prefilling
        rows feed their share of the step's prefill budget."""
        work: list[tuple[ActiveRequest, Work]] = []
        prefilling = []
        for active in list(self._rows):
            if active.request.aborted.is_set():
                self._end(active, active.finished(FinishReason.ABORT))
            elif active.logits is None:
                prefilling.append(active)
            else:
                outcome = self._guarded(active, self._decode_work, active)
                if isinstance(outcome, Finished):
                    self._end(active, outcome)
                elif outcome is not None:
                    work.append((active, outcome))
        shares = plan_prefill(self.scheduler, [(a, self._prompt_left(a)) for a in prefilling], decoding=len(work))
        for active, tokens in shares:
            work.append((active, self._prefill_work(active, tokens)))
        if work:
            self._forward(work)

    def _forward(self, work: list[tuple[ActiveRequest, Work]]) -> None:
        started = time.perf_counter()
        try:
            outputs = self.engine.step([row for _, (row, _) in work])
        except Exception as exc:  # a half-run forward may have updated some rows' layers and not others
            for active, _ in work:
                self._end(active, self._error(active, exc))
            return
        elapsed = time.perf_counter() - started
        for (active, (segment, on_logits)), logits in zip(work, outputs):
            if active.logits is None:
                active.prefill_forward_s += elapsed
            outcome = self._guarded(active, on_logits, logits)
            if outcome is not None:
                self._end(active, outcome)

    def _guarded(self, active: ActiveRequest, action: Callable, *args):
        """Run one row's own work; an exception ends that row only."""
        try:
            return action(*args)
        except Exception as exc:
            return self._error(active, exc)

    # ------------------------------------------------------------------ engine thread: one row's work

    def _decode_work(self, active: ActiveRequest) -> Work | Finished | None:
        """Choose the row's next token (or a speculative run) and return what it feeds the forward."""
        request = active.request
        if active.speculative is not None:
            plan = active.speculative.plan(active.logits, fence=request.fence, loop_guard=request.loop_guard,
                                           remaining=request.max_tokens - active.output.completion_tokens)
            if isinstance(plan, SpeculativeRun):  # no forward: the token ends the request
                return self._emit_run(active, plan)
            return Row(active.cache, plan.feed, all_logits=True), partial(self._verified, active, plan)
        if request.loop_guard is not None:
            request.loop_guard.ban(active.logits, request.fence)  # the token that would continue a loop
        # within the fence: grammar-invalid tokens are never chosen (masked only when the first draw strays)
        token = sample_fenced(active.sampler, active.logits, request.fence)  # [1, 1] of the logits' kind
        token_id = token.item()  # the one host sync per token
        if (finished := self._emit(active, token_id)) is not None:
            return finished
        return Row(active.cache, [token_id]), partial(self._decoded, active)

    @staticmethod
    def _decoded(active: ActiveRequest, logits: Logits) -> None:
        active.logits = logits

    def _verified(self, active: ActiveRequest, plan: DraftPlan, rows: Logits) -> Finished | None:
        return self._emit_run(active, active.speculative.resolve(plan, rows, active.cache))

    def _emit_run(self, active: ActiveRequest, run: SpeculativeRun) -> Finished | None:
        """A speculative step emits 1..k+1 tokens, each streamed as a plain step's (runtime/speculative.py)."""
        request = active.request
        for token_id in run.tokens:
            if (finished := self._emit(active, token_id)) is not None:
                # tokens after the ending were fed forward: keep what a plain loop's cache holds (prompt and
                # every emitted token but the last), which is what terminal_sequence() hands the prefix cache
                self.engine.crop(active.cache, len(request.prompt_ids) + len(active.generated) - 1)
                return finished
        assert run.logits is not None, "a run without a forward ends the request (stop token or last token)"
        active.logits = run.logits
        return None

    def _prompt_left(self, active: ActiveRequest) -> int:
        return len(active.request.prompt_ids) - self.engine.length(active.cache)

    def _prefill_work(self, active: ActiveRequest, tokens: int) -> Work:
        """The next `tokens` prompt tokens the row's cache lacks (never empty: the last prompt token is always
        prefilled, its logits choose the first output token)."""
        held = self.engine.length(active.cache)
        chunk = active.request.prompt_ids[held:held + tokens]
        return Row(active.cache, chunk), partial(self._prefilled, active)

    def _prefilled(self, active: ActiveRequest, logits: Logits) -> Finished | None:
        """After a prefill chunk's forward; Finished when a prefill-only request has its whole prompt."""
        if self._prompt_left(active) > 0:
            if time.perf_counter() - (active.progress_reported_at or active.admitted_at) >= PROGRESS_REPORT_S:
                self._report_progress(active)
            return None
        active.logits = logits
        active.prefilled_at = time.perf_counter()
        if self.prefix_cache is not None:
            self.prefix_cache.observe_prefill(len(active.request.prompt_ids) - active.cached_tokens,
                                              active.prefill_forward_s)
        self._observe(request_report("started", active.request, active))
        # a prewarm: nothing to sample; _end retires the prompt into the prefix cache like a finished request's
        return active.finished(FinishReason.PREFILLED) if active.request.prefill_only else None

    def _report_progress(self, active: ActiveRequest) -> None:
        """A "prefilling" report (`zllm status`, `zllm trace`): how much of the prompt the row's cache holds."""
        active.progress_reported_at = time.perf_counter()
        if self._observer is not None:
            self._observe(request_report("prefilling", active.request, active,
                                         prefilled_tokens=self.engine.length(active.cache)))

    # ------------------------------------------------------------------ engine thread: endings

    def _end(self, active: ActiveRequest, finished: Finished) -> None:
        """The row's one Finished: leave the batch, emit it, hand its KV to the prefix cache."""
        self._rows.remove(active)
        self._finish(active.request, finished, active)

    def _finish(self, request: EngineRequest, finished: Finished, active: ActiveRequest | None = None) -> None:
        """A request's one Finished (`active`: the row it ran as, None if it never started)."""
        request.report_prompt(finished.usage)  # a no-op unless the request never began
        request.emit(finished)
        if active is not None:
            self._retire(active, finished)  # after the emit: keeping KV must not delay the client's last event
        with self._lock:
            self._live.discard(request)  # after retiring: "no live request" means the cache is settled
        log_finished(request, finished, active)
        self._observe(request_report("finished", request, active, finished))

    def _error(self, active: ActiveRequest, exc: Exception) -> Finished:
        return error_finished(active.request, exc, active.output.completion_tokens, active.cached_tokens,
                              self._out_of_memory(exc))

    def _observe(self, report: RequestReport) -> None:
        if self._observer is None:
            return
        try:
            self._observer(report)
        except Exception:  # an observer's bug must not take the loop down
            log.exception("request observer failed")

    def _retire(self, active: ActiveRequest, finished: Finished) -> None:
        """Hand the terminal state to the prefix cache (or just return the lease when the request failed: a
        forward that raised may have updated some layers and not others)."""
        if active.lease is None:
            self.engine.release(active.cache)
            return
        kept = self.engine.kept_state(active.cache)
        try:
            if finished.reason is FinishReason.ERROR:
                self.prefix_cache.release(active.lease, kept.buffers)
                return
            held = self.engine.length(active.cache)  # what was computed: an abort may cut a prefill short
            active.kept = self.prefix_cache.finish(
                active.lease, active.terminal_sequence(held), kept.state, entry_id=active.request.request_id,
                prompt_length=active.terminal_prompt_length(held), buffers=kept.buffers)
        except Exception:  # losing a cache entry must never take the loop down
            log.exception("keeping the KV of %s failed", active.request.request_id)
            self.prefix_cache.release(active.lease, kept.buffers)

    # ------------------------------------------------------------------ engine thread: the output path

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
        if request.speculation is None or not self.engine.can_crop(active.cache):
            return None
        drafter = self.draft_model.drafter_for(request.prompt_ids) if self.draft_model is not None else None
        return SpeculativeStep(self.engine, active.sampler, request.prompt_ids, request.speculation,
                               stop_token_ids=self._stop_ids(request), drafter=drafter)

    def _stop_ids(self, request: EngineRequest) -> frozenset[int]:
        """Every token id the output path ends a request on (see StopTokens)."""
        return self._model_stops(request) | request.stop_token_ids

    def _model_stops(self, request: EngineRequest) -> frozenset[int]:
        return self._model_stop_ids | request.turn_stop_ids if request.use_model_stop_tokens else frozenset()

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


def continues_prewarm(request: EngineRequest, prewarm: EngineRequest, held: int) -> bool:
    """Whether `request` is the turn `prewarm` warmed: same namespace, and its prompt shares everything the
    prewarm computed so far (`held` tokens) and all of the prewarm's prompt but its last PREWARM_TAIL_TOKENS. A
    side request that shares only a system prompt does not qualify: it must not cut a long prewarm short."""
    if request.namespace != prewarm.namespace:
        return False
    ours, theirs = request.prompt_ids, prewarm.prompt_ids
    need = max(held, len(theirs) - PREWARM_TAIL_TOKENS)
    return len(ours) >= need and ours[:need] == theirs[:need]
