"""Speculative decoding never loosens the token fences: the guarantees of test_fenced_generation.py hold with it
on, and greedy output is the same, event for event, with and without it.

Engines that verify drafts in one forward have shipped "tool calls valid without speculation, malformed with it"
(a draft position checked against the wrong grammar state, a rejected draft's state left behind). Here the tiny
RANDOM-weight models run with speculation drafting as often as it can (any earlier occurrence of the last token,
almost no backoff), so the fence's forced tokens (markup, JSON keys, tool names) are drafted and verified in
nearly every step of a call, at temperature 1 over many seeds and at temperature 0 against the plain loop.

- temperature 1, speculation on: every seed's first call is complete and schema-valid under `required`, a named
  tool and `auto` (ZLLM_SPEC_FENCE_SEEDS seeds for Hermes, default 100; a fifth as many for GLM and DSML).
- temperature 0: the same events (text deltas, calls and their arguments, finish reason, usage) with speculation
  on and off, under `required`, `auto` and no fence at all, and every completed call valid.

A random model seldom opens a call under `auto`, so there its output is made to open one (`forced_opening`):
what follows the opening is the model's own choice within the fence. Every test also checks that drafts were
verified and accepted (`DraftCounter`), without which it would prove nothing.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from contextlib import nullcontext

import pytest

from tests.support.fenced_tools import TOOLS, TOOLS_BY_NAME, Case, backend_cases, load_case, run, valid
from tests.support.step_tap import StepTap, opened
from zllm.canonical import (
    ChatRequest,
    Event,
    Finished,
    FinishReason,
    Message,
    SamplingParams,
    TextDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
)
from zllm.runtime.client import LocalEngineClient
from zllm.runtime.report import RequestReport
from zllm.runtime.speculative import SpeculationConfig

SEEDS = int(os.environ.get("ZLLM_SPEC_FENCE_SEEDS", "100"))  # for hermes; the other dialects run a fifth as many
# draft whenever anything matches: the fence's forced tokens after every sampled one, lookups from 1-grams
AGGRESSIVE = SpeculationConfig(min_ngram=1, max_backoff=2)
# unfenced text from random weights seldom repeats a token, so nothing would be drafted: unfenced runs are made to
# open with this sentence of their prompt, which prompt lookup drafts and the verify forward accepts, then go on
# freely
ECHO = "the quick brown fox jumps over the lazy dog"
PROMPTS = (f"What is the weather? And repeat: {ECHO}.",
           f"Search the web for the tallest tower in Rome, then tell me the weather there. Then say {ECHO}.",
           f"Say hello, and {ECHO}.")
# room for a first call and part of a second (a DSML call is ~65 tokens over the V3.1 vocabulary)
GREEDY_MAX_TOKENS = {"hermes": 48, "glm45": 48, "deepseek-v3.2": 80, "harmony": 64}
# what constrains each greedy run: tools and tool choice (no tools: no fence at all)
FENCES = {"required": (TOOLS, ToolChoice("required")), "auto": (TOOLS, ToolChoice("auto")),
          "unfenced": ((), ToolChoice("auto"))}


class DraftCounter:
    """What speculation did, seen from outside the engine, for requests run one at a time: the logits rows each
    step kept (at the engine seam) and each request's completion tokens (the client's observer), both on the
    engine thread.

    Between a request's "started" report (its prompt is prefilled) and its "finished" one, every step is a
    decode step: it kept the logits after its sampled token and after each of its k draft tokens. A request
    that emitted more tokens than its decode steps + 1 (the last token needs no step) got the rest from
    accepted drafts, so `accepted_at_least` is a lower bound on them."""

    def __init__(self) -> None:
        self._settled = threading.Condition()
        self._decoding = False
        self.reset()

    def reset(self) -> None:
        self.requests = self.decode_forwards = self.drafted = self.completion_tokens = 0

    def after_step(self, rows, lengths, outputs):
        if self._decoding:
            for row in rows:
                self.decode_forwards += 1
                self.drafted += (len(row.token_ids) if row.all_logits else 1) - 1
        return outputs

    def observe(self, report: RequestReport) -> None:
        self._decoding = report.phase == "started"
        if report.phase == "finished":
            with self._settled:
                self.requests += 1
                self.completion_tokens += report.completion_tokens
                self._settled.notify_all()

    def wait_for(self, requests: int) -> None:
        """Until `requests` requests finished (a dropped stream's request ends a step after the drop)."""
        with self._settled:
            assert self._settled.wait_for(lambda: self.requests >= requests, timeout=60), "requests never finished"

    @property
    def accepted_at_least(self) -> int:
        return self.completion_tokens - self.decode_forwards - self.requests


@pytest.fixture(scope="module", params=backend_cases())
def engine(request):
    case, backend = request.param
    counter = DraftCounter()
    loaded = load_case(case, backend)
    client = LocalEngineClient(loaded, "m", 0, dialect=case.dialect, prefix_cache=False, speculative=True,
                               observer=counter.observe)
    client.speculation = AGGRESSIVE
    client.tap = StepTap(client)
    client.tap.listeners.append(counter.after_step)
    yield case, client, counter
    client.tap.remove()
    client.close()
    loaded.close()


def tool_request(prompt: str, choice: ToolChoice, sampling: SamplingParams, tools=TOOLS) -> ChatRequest:
    return ChatRequest(id=f"{len(tools)}-tools-{choice.mode}-{sampling.seed}", model="m",
                       messages=(Message("user", prompt),), tools=tools, tool_choice=choice, thinking=False,
                       sampling=sampling)


def generate(engine, request: ChatRequest, *, opening: str | None = None, until_first_call: bool = False
             ) -> list[Event]:
    """The request's events (tool call ids blanked: they are random), its output made to open with `opening`;
    with `until_first_call` the stream is dropped after the first call, which aborts the rest. Returns once the
    engine reported the request finished: requests run one at a time (see DraftCounter)."""
    _, client, counter = engine
    finished_before = counter.requests

    async def collect() -> list[Event]:
        events = []
        async for event in await client.submit(request):
            events.append(dataclasses.replace(event, id="") if isinstance(event, ToolCallStart) else event)
            if until_first_call and isinstance(event, ToolCallEnd):
                break
        return events

    with opened(client.tap, client, request, opening) if opening else nullcontext():
        events = run(collect())
    counter.wait_for(finished_before + 1)
    return events


def completed_calls(events: list[Event]) -> list[tuple[str, str]]:
    """(name, arguments) of each call the model completed. A call the budget or the loop guard cut off still
    gets its ToolCallEnd, its arguments as they stood, right before Finished: it is not one of them."""
    names = {event.index: event.name for event in events if isinstance(event, ToolCallStart)}
    calls = [(names[event.index], event.arguments) for event in events if isinstance(event, ToolCallEnd)]
    ending = events[-1]
    if (isinstance(ending, Finished) and ending.reason in (FinishReason.LENGTH, FinishReason.REPETITION)
            and isinstance(events[-2], ToolCallEnd)):
        return calls[:-1]
    return calls


def seeds_for(case: Case) -> range:
    return range(SEEDS if case.name == "hermes" else max(SEEDS // 5, 1))


def assert_drafts_verified_and_accepted(counter: DraftCounter, requests: int) -> None:
    """Drafting is aggressive and every call's markup and keys are forced: a few drafts per request at least."""
    assert counter.requests == requests, "the counts cover other requests too"
    assert counter.drafted >= 3 * requests, f"{counter.drafted} draft tokens over {requests} requests"
    assert counter.accepted_at_least >= requests, (
        f"at least {counter.accepted_at_least} of {counter.drafted} drafts accepted over {requests} requests")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("tool", "search"), ToolChoice("auto")],
                         ids=["required", "named", "auto"])
def test_first_call_is_valid_for_every_seed_with_speculation(engine, choice) -> None:
    case, _, counter = engine
    counter.reset()
    seeds = seeds_for(case)
    for seed in seeds:
        # room for the longest call (DSML tags are several tokens each over the V3.1 vocabulary)
        sampling = SamplingParams(temperature=1.0, seed=seed, max_tokens=200)
        events = generate(engine, tool_request("What is the weather?", choice, sampling),
                          opening=case.opening if choice.mode == "auto" else None, until_first_call=True)
        text = "".join(event.text for event in events if isinstance(event, TextDelta))
        calls = completed_calls(events)
        assert calls, f"{case.name} seed {seed}: no complete call within the budget (text {text!r})"
        name, arguments = calls[0]
        assert choice.name in (None, name), f"{case.name} seed {seed}: called {name}, not the named tool"
        assert valid(TOOLS_BY_NAME[name], arguments), f"{case.name} seed {seed}: invalid call {name} {arguments}"
        assert not text.strip(), f"{case.name} seed {seed}: text {text!r} before the call ({choice.mode})"
    assert_drafts_verified_and_accepted(counter, len(seeds))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fence", FENCES)
def test_greedy_output_is_the_same_with_and_without_speculation(engine, fence) -> None:
    case, client, counter = engine
    tools, choice = FENCES[fence]
    opening = {"required": None, "auto": case.opening, "unfenced": ECHO}[fence]
    greedy = SamplingParams(temperature=0.0, max_tokens=GREEDY_MAX_TOKENS[case.name])
    requests = [tool_request(prompt, choice, greedy, tools) for prompt in PROMPTS]
    client.speculation = None
    counter.reset()
    try:
        plain = [generate(engine, request, opening=opening) for request in requests]
    finally:
        client.speculation = AGGRESSIVE
    assert counter.drafted == 0, "speculation is off: nothing may be drafted"
    counter.reset()
    speculative = [generate(engine, request, opening=opening) for request in requests]
    for request, without, with_ in zip(requests, plain, speculative):
        where = f"{case.name}, {fence}, {request.messages[0].content!r}"
        assert with_ == without, f"{where}: speculation changed the output"
        calls = completed_calls(with_)
        assert calls or fence == "unfenced", f"{where}: no complete call"
        assert all(valid(TOOLS_BY_NAME[name], arguments) for name, arguments in calls), f"{where}: {calls}"
    assert_drafts_verified_and_accepted(counter, len(requests))
