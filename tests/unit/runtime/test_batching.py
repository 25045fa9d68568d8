"""Continuous batching through LocalEngineClient on the tiny Qwen3 model: requests that run together produce
exactly what each produces alone (greedy and seeded sampling, fenced or not, from any cache state), an aborted
row leaves at the next step without disturbing the others, speculating rows (prompt lookup on both backends, a
draft model on torch), fenced and not, run in the same steps as plain rows and give each row's greedy tokens
alone, and admission honours max_batch and the cache budget without starving a request that needs more room.

`Steps` wraps the engine's `step` (engine/contract.py: the one call per engine step) to see each step's rows, and
can hold the first step until the test has queued every request, so which requests run together is the
test's choice rather than the thread pool's timing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass

import pytest
import torch

from tests.support.backends import BACKENDS, load_tiny
from tests.support.fenced_tools import TOOLS, TOOLS_BY_NAME, WEATHER, valid
from tests.support.step_tap import LogitMargins, StepTap, forced_opening
from zllm.canonical import (
    ChatRequest,
    Finished,
    FinishReason,
    Message,
    ResponseFormat,
    SamplingParams,
    TextDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
    Usage,
)
from zllm.engine.torch.cache.pool import CAPACITY_QUANTUM, round_capacity
from zllm.engine.torch.cache.state import KVLayout
from zllm.engine.torch.draft_model import DraftModel
from zllm.engine.torch.runner import ModelRunner
from zllm.kvcache import CacheConfig
from zllm.runtime.client import LocalEngineClient
from zllm.runtime.report import RequestReport
from zllm.runtime.scheduler import SchedulerConfig
from zllm.runtime.speculative import SpeculationConfig

MODEL = "tiny"
CODE = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(14))  # ~190 tokens
LONG_SYSTEM = " ".join(f"rule{i}: keep functions small." for i in range(170))  # ~1150 tokens: two working sets


def chat(rid: str, text: str, *, max_tokens: int, system: str | None = None, namespace: str = "",
         **sampling) -> ChatRequest:
    messages = ((Message("system", system),) if system else ()) + (Message("user", text),)
    sampling.setdefault("temperature", 0.0)
    return ChatRequest(id=rid, model=MODEL, messages=messages, namespace=namespace,
                       sampling=SamplingParams(max_tokens=max_tokens, **sampling))


# mixed prompt lengths and budgets, so rows finish at different steps while others still prefill or decode
REQUESTS = (
    chat("short", "Hi", max_tokens=10),
    chat("medium", "Explain the difference between a list and a tuple in Python, briefly.", max_tokens=14),
    chat("long", f"Review this file:\n{CODE}", max_tokens=8),
    chat("sum", "What is 2+2?", max_tokens=16),
    chat("system", "Summarize our rules.", system="You are terse. Answer in one line. Never apologize.",
         max_tokens=12),
    chat("haiku", "Write a haiku", max_tokens=6),
)


@dataclass(frozen=True)
class Outcome:
    """What a client sees of one request (tool call ids are minted per call, so only names and arguments)."""

    text: str
    calls: tuple[tuple[str, str], ...]
    reason: FinishReason
    usage: Usage


class Steps:
    """Wraps `client.engine.engine.step` (the one call per engine step): records each step's row token counts,
    running rows and what each request's row fed, runs `actions[n]` just before step n (1-based), and with
    `hold` keeps step 1 waiting until `release()`."""

    def __init__(self, client: LocalEngineClient, *, hold: bool = False,
                 actions: dict[int, Callable[[], None]] | None = None):
        self.engine = client.engine
        self.rows: list[list[int]] = []  # per step: tokens each row fed
        self.running: list[int] = []  # per step: rows running
        self.fed: list[dict[str, str]] = []  # per step: request id -> "prefill", "decode" or "verify" (a draft)
        self.entered, self.released = threading.Event(), threading.Event()
        self.actions = actions or {}
        if not hold:
            self.released.set()
        self._forward_rows = client.engine.engine.step
        client.engine.engine.step = self._step

    def _step(self, segments):
        self.entered.set()
        assert self.released.wait(30), "the test never released the held step"
        self.rows.append([len(segment.token_ids) for segment in segments])
        self.running.append(self.engine.running)
        self.fed.append(self._fed(segments))
        if (action := self.actions.get(len(self.rows))) is not None:
            action()
        return self._forward_rows(segments)

    def _fed(self, segments) -> dict[str, str]:
        """What each row of this step feeds, by request (the rows are the engine loop's, on its thread)."""
        rows = {id(active.cache): active for active in self.engine._rows}
        fed = {}
        for segment in segments:
            active = rows[id(segment.seq)]
            kind = "prefill" if active.logits is None else "verify" if len(segment.token_ids) > 1 else "decode"
            fed[active.request.request_id] = kind
        return fed

    def release(self) -> None:
        self.released.set()

    async def first_step_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 30), "the engine never started a step"


class Starts:
    """Observer: the order requests finished their prefill ("started" reports), and their cache tiers."""

    def __init__(self):
        self.reports: list[RequestReport] = []

    def __call__(self, report: RequestReport) -> None:
        if report.phase == "started":
            self.reports.append(report)

    @property
    def order(self) -> list[str]:
        return [report.request_id for report in self.reports]

    def tier(self, request_id: str) -> str:
        return next(report.cache_tier for report in self.reports if report.request_id == request_id)


@pytest.fixture
def backend() -> str:
    """The engine backend a test runs on; a test that holds on both says so:
    `@pytest.mark.parametrize("backend", BACKENDS)`."""
    return "torch"


@pytest.fixture(scope="module")
def served_models(tiny_qwen):
    """The tiny Qwen3 model per backend (the same weights on llama.cpp as an F32 GGUF), loaded once."""
    models = {"torch": tiny_qwen}

    def get(backend: str):
        if backend not in models:
            models[backend] = load_tiny("qwen3", backend, context_length=tiny_qwen.context_length)
        return models[backend]

    yield get
    for loaded in models.values():
        loaded.close()


@pytest.fixture
def make_client(served_models, backend, tmp_path):
    clients = []
    served = served_models(backend)

    def make(*, scheduler: SchedulerConfig | None = None, budget: int = 64 << 20, ssd: bool = False,
             prefix_cache: bool = True, observer=None, context_length: int | None = None,
             draft_model: DraftModel | None = None) -> LocalEngineClient:
        loaded = served if context_length is None else dataclasses.replace(served, context_length=context_length)
        config = CacheConfig(device_budget_bytes=budget, ssd_dir=tmp_path / "kv" if ssd else None, ssd_min_tokens=1)
        clients.append(LocalEngineClient(loaded, MODEL, 1, cache_config=config, prefix_cache=prefix_cache,
                                         observer=observer, scheduler=scheduler, draft_model=draft_model))
        return clients[-1]

    yield make
    for client in clients:
        client.close()
        # Steps and StepTap wrap the engine's step; llama.cpp's engine is the module's, shared by later clients
        vars(client.engine.engine).pop("step", None)


@pytest.fixture(scope="module")
def alone_by_backend(served_models):
    """Per backend, each request run alone: no prefix cache, default scheduler (no chunking of these prompts)."""
    outcomes = {}

    def get(backend: str) -> dict[str, Outcome]:
        if backend not in outcomes:
            client = LocalEngineClient(dataclasses.replace(served_models(backend), context_length=4096), MODEL, 1,
                                       prefix_cache=False)
            try:
                outcomes[backend] = {request.id: run_alone(client, request) for request in REQUESTS}
            finally:
                client.close()
        return outcomes[backend]

    return get


@pytest.fixture(scope="module")
def alone_client(tiny_qwen):
    """Runs torch references one request at a time: no prefix cache, default scheduler."""
    client = LocalEngineClient(dataclasses.replace(tiny_qwen, context_length=4096), MODEL, 1, prefix_cache=False)
    yield client
    client.close()


@pytest.fixture
def alone(alone_by_backend, backend) -> dict[str, Outcome]:
    return alone_by_backend(backend)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=90))


async def consume(stream) -> Outcome:
    text, names, calls, finished = "", {}, [], None
    async for event in stream:
        if isinstance(event, TextDelta):
            text += event.text
        elif isinstance(event, ToolCallStart):
            names[event.index] = event.name
        elif isinstance(event, ToolCallEnd):
            calls.append((names[event.index], event.arguments))
        elif isinstance(event, Finished):
            finished = event
    return Outcome(text, tuple(calls), finished.reason, finished.usage)


def run_alone(client: LocalEngineClient, request: ChatRequest) -> Outcome:
    async def main():
        return await consume(await client.submit(request))
    return run(main())


async def together(client: LocalEngineClient, requests, steps: Steps) -> list[Outcome]:
    """Submit concurrently while `steps` holds the first step, so every request is queued before it runs."""
    try:
        streams = await asyncio.gather(*(client.submit(request) for request in requests))
    finally:
        steps.release()
    return list(await asyncio.gather(*(consume(stream) for stream in streams)))


async def in_order(client: LocalEngineClient, requests, steps: Steps) -> list[Outcome]:
    """The first request alone in step 1 (held), the rest queued behind it in this order."""
    try:
        streams = [await client.submit(requests[0])]
        await steps.first_step_entered()
        streams += [await client.submit(request) for request in requests[1:]]
    finally:
        steps.release()
    return list(await asyncio.gather(*(consume(stream) for stream in streams)))


def settle(client: LocalEngineClient) -> None:
    """Wait until the engine retired every request (the last event is sent before the KV is handed back)."""
    async def idle():
        while client.engine._live:
            await asyncio.sleep(0.01)
    run(idle())


def working_set_bytes(loaded) -> int:
    """Bytes of one working set of the smallest capacity (what a short request holds while it runs)."""
    with torch.inference_mode():
        layout = KVLayout.of(ModelRunner(loaded.model).probe_kv_state())
    return layout.bytes_per_token * CAPACITY_QUANTUM


def prompt_tokens(client: LocalEngineClient, request: ChatRequest) -> int:
    return len(client.renderer.render(request).token_ids)


# ------------------------------------------------------------------------------------------- greedy rows


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_rows_together_equal_each_alone_token_for_token(make_client, alone) -> None:
    client = make_client(prefix_cache=False,
                         scheduler=SchedulerConfig(max_batch=8, prefill_chunk=16, idle_prefill_chunk=24))
    steps = Steps(client, hold=True)
    outcomes = run(together(client, REQUESTS, steps))
    assert outcomes == [alone[request.id] for request in REQUESTS]
    assert all(outcome.reason is FinishReason.LENGTH for outcome in outcomes)  # full budgets: nothing cut short
    assert max(steps.running) == len(REQUESTS)  # all rows ran together
    assert max(max(rows) for rows in steps.rows) <= 24  # every prompt was fed in chunks
    assert prompt_tokens(client, REQUESTS[2]) > 4 * 24  # so the long one took several
    mixed = [rows for rows in steps.rows if 1 in rows and any(n > 1 for n in rows)]
    assert mixed, "some step carried decode tokens and prefill chunks together"


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_batch_is_honoured_and_waiting_rows_join_as_others_leave(make_client, alone) -> None:
    client = make_client(prefix_cache=False, scheduler=SchedulerConfig(max_batch=2))
    steps = Steps(client, hold=True)
    outcomes = run(together(client, REQUESTS, steps))
    assert outcomes == [alone[request.id] for request in REQUESTS]
    assert max(steps.running) == 2 and max(len(rows) for rows in steps.rows) == 2


# ------------------------------------------------------------------------------------------- cache states


def test_cold_device_hit_and_ssd_restore_run_together_and_answer_like_cold_runs(
        make_client, tiny_qwen, alone_client) -> None:
    """Three working sets fit the budget, cached entries hardly: earlier turns are evicted to the SSD tier."""
    starts = Starts()
    client = make_client(ssd=True, budget=3 * working_set_bytes(tiny_qwen), observer=starts, context_length=4096)
    x1 = chat("x1", "Plan the refactor of the parser.", max_tokens=8, namespace="x", system=LONG_SYSTEM[:1500])
    text_x1 = run_alone(client, x1).text
    client.prefix_cache.flush()  # its snapshot is on disk before the device tier lets it go
    for i in range(8):  # long unrelated requests until the device tier evicts x1 (each its namespace's main
        # conversation, which may take another namespace's: in one namespace each would only replace the last)
        filler = chat(f"filler{i}", "ok", max_tokens=2, namespace=f"filler{i}", system=f"{i} {LONG_SYSTEM[:3500]}")
        run_alone(client, filler)
        settle(client)
        if "x1" not in client.prefix_cache.graph.entries:
            break
    assert "x1" not in client.prefix_cache.graph.entries, "x1 was never evicted"
    y1 = chat("y1", "Write a sorting function.", max_tokens=8, namespace="y")
    text_y1 = run_alone(client, y1).text
    settle(client)
    assert "y1" in client.prefix_cache.graph.entries

    x2 = dataclasses.replace(x1, id="x2", messages=(*x1.messages, Message("assistant", text_x1),
                                                     Message("user", "Start with the lexer.")))
    y2 = dataclasses.replace(y1, id="y2", messages=(*y1.messages, Message("assistant", text_y1),
                                                     Message("user", "Now make it stable.")))
    z = chat("z", "Name three prime numbers.", max_tokens=8, namespace="z")
    steps = Steps(client, hold=True)
    outcomes = run(in_order(client, [y2, x2, z], steps))  # y2 first: its entry is looked up before evictions

    assert (starts.tier("y2"), starts.tier("x2"), starts.tier("z")) == ("device", "ssd", "cold")
    assert max(steps.running) == 3
    for request, outcome in zip([y2, x2, z], outcomes):
        reference = run_alone(alone_client, request)
        assert (outcome.text, outcome.reason) == (reference.text, reference.reason), request.id
        assert outcome.usage == dataclasses.replace(reference.usage, cached_tokens=outcome.usage.cached_tokens)
        usage = outcome.usage  # what was not restored is kept for next time; alone, with no cache, nothing is
        assert (usage.cache_write_tokens, reference.usage.cache_write_tokens) == (
            usage.prompt_tokens - usage.cached_tokens, 0)
    y_cached, x_cached, z_cached = (outcome.usage.cached_tokens for outcome in outcomes)
    assert y_cached > prompt_tokens(client, y1) and x_cached > prompt_tokens(client, x1) and z_cached == 0
    settle(client)
    assert client.prefix_cache.stats().pool_in_use_bytes == 0


# ------------------------------------------------------------------------------------------- fenced, seeded

VERDICT = {"type": "object",
           "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]},
                          "score": {"type": "integer", "minimum": 0, "maximum": 9}},
           "required": ["verdict", "score"], "additionalProperties": False}


def valid_verdict(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"verdict", "score"} and value["verdict"] in ("yes", "no") and 0 <= value["score"] <= 9


def sampled(rid: str, seed: int, **extra) -> ChatRequest:
    return dataclasses.replace(chat(rid, "What is the weather in Rome?", max_tokens=60, temperature=1.0, seed=seed),
                               **extra)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fenced_and_seeded_rows_together_are_valid_and_equal_each_alone(make_client) -> None:
    client = make_client(prefix_cache=False)
    requests = [
        sampled("tools0", 0, tools=(WEATHER,), tool_choice=ToolChoice("required"), thinking=False),
        sampled("tools1", 1, tools=(WEATHER,), tool_choice=ToolChoice("required"), thinking=False),
        sampled("json2", 2, response_format=ResponseFormat(VERDICT)),
        sampled("json3", 3, response_format=ResponseFormat(VERDICT)),
        dataclasses.replace(sampled("free4", 4), sampling=SamplingParams(temperature=1.0, seed=4, max_tokens=16)),
    ]
    solo = [run_alone(client, request) for request in requests]
    steps = Steps(client, hold=True)
    outcomes = run(together(client, requests, steps))
    assert outcomes == solo  # each row's seeded generator is its own: batching changes nothing
    assert max(steps.running) == len(requests)
    for outcome in outcomes[:2]:
        # a random-weight model may open one call too many: the token budget, not the fence, cuts that one
        complete = outcome.calls[:-1] if outcome.reason is FinishReason.LENGTH else outcome.calls
        assert complete and all(name == "get_weather" and valid(WEATHER, args) for name, args in complete)
    for outcome in outcomes[2:4]:
        assert outcome.reason is FinishReason.STOP and valid_verdict(outcome.text)


# ------------------------------------------------------------------------------------------- speculative rows

# short drafts whenever anything matches (any earlier occurrence of the last token, no backoff), so rows verify
# drafts in nearly every step, over several steps: the fences' forced tokens, the echoes below, and rejected
# lookups whose crops run beside the other rows
LOOKUP = SpeculationConfig(max_draft=3, min_ngram=1, max_backoff=0)
# the target drafting for itself (torch only): every unforced greedy draft is right
SELF_DRAFT = SpeculationConfig(max_draft=3, max_backoff=0)
ECHO = " the quick brown fox jumps over the lazy dog while five boxing wizards jump quickly"
LINE = "def f3(x):\n    return x * 3 + 3\ndef f4(x):\n    return x * 4 + 4\n"


def tool_chat(rid: str, choice: ToolChoice, *, max_tokens: int) -> ChatRequest:
    request = chat(rid, "What is the weather in Rome? Then search for towers.", max_tokens=max_tokens)
    return dataclasses.replace(request, tools=TOOLS, tool_choice=choice, thinking=False)


# speculating rows, fenced (tool_choice required and a named tool) and not, and plain rows beside them
SPECULATING = (
    chat("spec-echo", f"Repeat after me:{ECHO}.", max_tokens=28),
    chat("spec-code", f"Review this file:\n{CODE[:300]}", max_tokens=20),
    tool_chat("spec-required", ToolChoice("required"), max_tokens=40),
    tool_chat("spec-named", ToolChoice("tool", "search"), max_tokens=32),
)
PLAIN = (
    chat("plain-haiku", "Write a haiku", max_tokens=24),
    tool_chat("plain-required", ToolChoice("required"), max_tokens=36),
)
FENCED = {"spec-required", "spec-named", "plain-required"}
# random weights seldom repeat a token, so unfenced rows would find little to look up: they are made to open by
# echoing a passage of their prompt (the same alone and batched), which prompt lookup drafts and the verify
# accepts
ECHOES = {"spec-echo": ECHO, "spec-code": LINE}


class Generated:
    """Each row's generated token ids, read where the engine loop ends the row (`_end`, its one ending)."""

    def __init__(self, client: LocalEngineClient):
        self.tokens: dict[str, list[int]] = {}
        end = client.engine._end

        def recording_end(active, finished) -> None:
            self.tokens[active.request.request_id] = list(active.generated)
            end(active, finished)

        client.engine._end = recording_end


class Finishes:
    """Observer: each request's "finished" report (its speculation counts among them)."""

    def __init__(self):
        self.reports: dict[str, RequestReport] = {}

    def __call__(self, report: RequestReport) -> None:
        if report.phase == "finished":
            self.reports[report.request_id] = report


def echoing(client: LocalEngineClient, tap: StepTap) -> ExitStack:
    """Make each ECHOES row open with its passage (keyed by the row's request, on the engine thread)."""
    stack = ExitStack()
    tokenizer = client.loaded.tokenizer
    for request in SPECULATING:
        if request.id in ECHOES:
            def only(row, request_id=request.id) -> bool:
                return any(active.cache is row.seq and active.request.request_id == request_id
                           for active in client.engine._rows)
            token_ids = tokenizer.encode(ECHOES[request.id], add_special_tokens=False)
            stack.enter_context(forced_opening(tap, prompt_tokens(client, request), token_ids, only))
    return stack


async def submitted(client: LocalEngineClient, request: ChatRequest, speculation: SpeculationConfig | None):
    """Submit `request` speculating with `speculation` (None: plain), whatever the client's setting: the
    client hands its setting to every request it submits, so around one awaited submit it is this one's."""
    served = client.speculation
    client.speculation = speculation
    try:
        return await client.submit(request)
    finally:
        client.speculation = served


async def mixed(client: LocalEngineClient, speculation: SpeculationConfig, steps: Steps) -> list[Outcome]:
    """SPECULATING with `speculation` and PLAIN without, queued while `steps` holds the first step."""
    try:
        streams = [await submitted(client, request, speculation) for request in SPECULATING]
        streams += [await submitted(client, request, None) for request in PLAIN]
    finally:
        steps.release()
    return list(await asyncio.gather(*(consume(stream) for stream in streams)))


def plain_alone(client: LocalEngineClient, request: ChatRequest) -> Outcome:
    async def main():
        return await consume(await submitted(client, request, None))
    return run(main())


# llama.cpp's CPU kernels are not batch-invariant: a drafted run verified as one k-row step sums in another order
# than k one-row decode steps (measured on this tiny F32 model: logits differ by 1.6e-4 to 5.5e-4 between 1-row,
# 2-row and mixed splits of a 40-token prompt, flash attention or not; 4.4e-3 seen at a divergence in this test).
# Where a random-weight model's two best tokens lie that close, the verified run may take the other one: allowed
# there (each run's winner led by at most TIE_BOUND), and nowhere else. Issue 26 owns the fix. (--exact-cache makes
# a verify step equal the one-token steps bit for bit on a model whose heads hold Q8_0 cells: the default's, in
# test_llamacpp_exact_cache.py; this model's 16-wide heads cannot, so the allowance stays here.)
TIE_BOUND = 1e-2


def row_request(client: LocalEngineClient) -> Callable:
    """For LogitMargins: a row's request id and prompt length (engine thread, while the row runs)."""
    def request_of(row) -> tuple[str, int]:
        active = next(a for a in client.engine._rows if a.cache is row.seq)
        return active.request.request_id, len(active.request.prompt_ids)
    return request_of


def diverged_at_ties(mixed: dict[str, list[int]], solo: dict[str, list[int]], margins: LogitMargins,
                     mixed_margins: LogitMargins) -> set[str]:
    """The requests whose mixed run left the solo run's tokens; each must have left at a near-tie (TIE_BOUND) of
    both runs' logits, else the assertion fails."""
    tied = set()
    for request_id, tokens in solo.items():
        other = mixed[request_id]
        if other == tokens:
            continue
        index = next((i for i, (a, b) in enumerate(zip(tokens, other)) if a != b), None)
        assert index is not None, (request_id, "same tokens, different length", tokens, other)
        margin = margins.margin(request_id, index, tokens[index], other[index])
        mixed_margin = mixed_margins.margin(request_id, index, other[index], tokens[index])
        assert margin <= TIE_BOUND and mixed_margin <= TIE_BOUND, (request_id, index, margin, mixed_margin)
        tied.add(request_id)
    return tied


def shared_steps(steps: Steps) -> int:
    """Steps in which a fenced and an unfenced speculating row each verified a draft while a plain row decoded:
    the speculating rows really ran together, beside plain ones, not one after another."""
    unfenced = {request.id for request in SPECULATING} - FENCED
    fenced = FENCED - {request.id for request in PLAIN}
    plain = {request.id for request in PLAIN}
    shared = 0
    for fed in steps.fed:
        verifying = {rid for rid, kind in fed.items() if kind == "verify"}
        shared += bool(verifying & fenced and verifying & unfenced and any(fed.get(r) == "decode" for r in plain))
    return shared


def assert_speculated(reports: dict[str, RequestReport]) -> None:
    """Every speculating row had drafts verified and accepted (forced keys, echoes), no plain row drafted."""
    for request in SPECULATING:
        report = reports[request.id]
        assert report.drafted_tokens > 0 and report.accepted_tokens > 0, report
    assert all(reports[request.id].drafted_tokens == 0 for request in PLAIN)


@pytest.mark.parametrize("drafter", ["lookup", "draft-model"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_speculating_rows_fenced_and_not_beside_plain_rows_equal_each_alone(make_client, served_models, backend,
                                                                            drafter) -> None:
    """Greedy: each row's tokens, events and usage are those of the request run alone without speculation."""
    served = served_models(backend)
    draft = None
    if drafter == "draft-model":  # the model drafting for itself (llama.cpp: its GGUF, engine/llamacpp/draft_model.py)
        draft = (DraftModel.for_target(served, served.tokenizer) if backend == "torch"
                 else served.load_draft_model(served.path, dtype="float32", threads=1))
    finishes = Finishes()
    client = make_client(prefix_cache=False, observer=finishes, draft_model=draft)
    generated, tap = Generated(client), StepTap(client)
    requests = SPECULATING + PLAIN
    # echoes give prompt lookup something to draft; a draft model drafts its own continuation, which they would
    # turn into rejections only
    with echoing(client, tap) if draft is None else nullcontext():
        with LogitMargins(tap, row_request(client)) as margins:
            solo = [plain_alone(client, request) for request in requests]
        solo_tokens = dict(generated.tokens)
        steps = Steps(client, hold=True)
        with LogitMargins(tap, row_request(client)) as mixed_margins:
            outcomes = run(mixed(client, SELF_DRAFT if draft is not None else LOOKUP, steps))
    mixed_tokens = {request.id: generated.tokens[request.id] for request in requests}
    tied = diverged_at_ties(mixed_tokens, solo_tokens, margins, mixed_margins) if backend == "llamacpp" else set()
    assert [o for o, r in zip(outcomes, requests) if r.id not in tied] == \
        [s for s, r in zip(solo, requests) if r.id not in tied]
    assert {rid: tokens for rid, tokens in mixed_tokens.items() if rid not in tied} == \
        {rid: tokens for rid, tokens in solo_tokens.items() if rid not in tied}
    assert max(steps.running) == len(requests)
    assert shared_steps(steps) >= 3, steps.fed
    assert_speculated(finishes.reports)
    for outcome, request in zip(outcomes, requests):
        if request.id in FENCED:  # greedy within the fence: a valid first call, of the named tool if one is named
            name, arguments = outcome.calls[0]
            assert request.tool_choice.name in (None, name) and valid(TOOLS_BY_NAME[name], arguments), outcome


# ------------------------------------------------------------------------------------------- cancellation


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_aborted_row_leaves_at_the_next_step_and_the_others_are_unchanged(make_client, alone, tiny_qwen,
                                                                             backend) -> None:
    client = make_client()
    victim = chat("victim", "Tell me a very long story.", max_tokens=200)
    others = REQUESTS[:3]  # each needs at least 8 more steps after its prefill: all outlive the abort
    streams, in_use = {}, {}
    abort_before = 6  # step 1 prefills the victim alone, step k feeds its token k-1

    def abort() -> None:
        in_use["before"] = client.prefix_cache.stats().pool_in_use_bytes
        streams["victim"].abort()

    def after() -> None:
        in_use["after"] = client.prefix_cache.stats().pool_in_use_bytes

    steps = Steps(client, hold=True, actions={abort_before: abort, abort_before + 1: after})

    async def main():
        try:
            streams["victim"] = await client.submit(victim)
            await steps.first_step_entered()
            rest = [await client.submit(request) for request in others]
        finally:
            steps.release()
        return await asyncio.gather(*(consume(stream) for stream in (streams["victim"], *rest)))

    aborted, *finished = run(main())
    assert aborted.reason is FinishReason.ABORT
    assert aborted.usage.completion_tokens == abort_before - 1  # nothing sampled after the abort
    assert steps.running[abort_before - 1:abort_before + 1] == [4, 3]  # gone from the very next step
    assert len(steps.rows[abort_before]) == 3
    if backend == "torch":  # pooled working sets of one size
        set_bytes = working_set_bytes(tiny_qwen)
        assert (in_use["before"], in_use["after"]) == (4 * set_bytes, 3 * set_bytes)  # its buffers went back at once
    else:  # llama.cpp: the pool tokens it reserved (its prompt and decode growth) went back at once
        victim_tokens = len(client.renderer.render(victim).token_ids) + 200
        cache = client.prefix_cache
        assert in_use["before"] - in_use["after"] == victim_tokens * cache.kv.bytes_per_token
    assert finished == [alone[request.id] for request in others]
    settle(client)
    assert client.prefix_cache.stats().pool_in_use_bytes == 0


# ------------------------------------------------------------------------------------------- admission


def test_admission_keeps_running_working_sets_within_the_cache_budget(make_client, tiny_qwen, alone) -> None:
    client = make_client(budget=int(2.5 * working_set_bytes(tiny_qwen)))
    steps = Steps(client, hold=True)
    requests = REQUESTS[:5]
    outcomes = run(together(client, requests, steps))
    assert all(outcome.reason is FinishReason.LENGTH for outcome in outcomes)  # nobody refused or failed
    assert [outcome.text for outcome in outcomes] == [alone[request.id].text for request in requests]
    assert max(steps.running) == 2
    settle(client)
    assert client.prefix_cache.stats().pool_in_use_bytes == 0


@pytest.mark.parametrize("fair_wait_s", [0.0, 60.0])
def test_a_request_that_does_not_fit_is_passed_only_until_its_fair_wait_ends(make_client, tiny_qwen,
                                                                            fair_wait_s) -> None:
    """`first` runs; `big` needs two working sets and does not fit beside it; `small1`/`small2` would. With no
    fair wait nobody passes `big`; with a long one `small1` does."""
    starts = Starts()
    client = make_client(budget=int(2.5 * working_set_bytes(tiny_qwen)), observer=starts, context_length=4096,
                         scheduler=SchedulerConfig(fair_wait_s=fair_wait_s))
    first = chat("first", "Count to twenty.", max_tokens=24)
    big = chat("big", "Summarize the rules.", system=LONG_SYSTEM, max_tokens=4)
    small1, small2 = chat("small1", "Hi", max_tokens=6), chat("small2", "Hello", max_tokens=6)
    assert round_capacity(prompt_tokens(client, big) + 4) == 2 * CAPACITY_QUANTUM  # the premise: two sets
    steps = Steps(client, hold=True)
    outcomes = run(in_order(client, [first, big, small1, small2], steps))
    assert all(outcome.reason is FinishReason.LENGTH for outcome in outcomes)
    assert max(steps.running) <= 2
    order = starts.order
    if fair_wait_s == 0:
        assert order == ["first", "big", "small1", "small2"] or order == ["first", "big", "small2", "small1"]
    else:
        assert order.index("small1") < order.index("big")
