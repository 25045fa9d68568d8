"""Fenced generation with tiny RANDOM-weight models, one per dialect, sampled at temperature 1 over many seeds.

Random weights know nothing about tools: whatever valid output appears is the fence's doing.
- `required` and a named tool: every seed's first call completes and is schema-valid (the stream is dropped
  right after it, which aborts the rest: a random model would go on calling until max_tokens).
- `auto`: every call that completes is valid. A random model seldom opens one where free text is allowed, so
  every other seed's output is made to open with the dialect's call opening (`forced_opening`, at the engine
  seam): the fence must let it through, and what follows is the model's own choice within the fence — a call
  that completes and is valid. Half the seeds at least open a call, so the test cannot pass on text alone.
- `none`: no seed ever produces a call, or the dialect's call trigger in its text, even when made to open one.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass

import pytest

from tests.support.fenced_tools import TOOLS, TOOLS_BY_NAME, backend_cases, load_case, run, valid
from tests.support.step_tap import StepTap, opened
from zllm.canonical import (
    ChatRequest,
    Finished,
    Message,
    SamplingParams,
    TextDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
)
from zllm.runtime.client import LocalEngineClient

SEEDS = os.environ.get("ZLLM_FENCE_SEEDS")  # every case's seeds; unset: each case's default_seeds


def seeds_of(case) -> int:
    return int(SEEDS) if SEEDS else case.default_seeds
FIRST_CALL_BUDGET = 200  # room for the longest first call (DSML tags are several tokens each over V3.1's vocabulary)


@pytest.fixture(scope="module", params=backend_cases())
def engine(request):
    case, backend = request.param
    loaded = load_case(case, backend)
    client = LocalEngineClient(loaded, "m", 0, dialect=case.dialect, prefix_cache=False)
    client.tap = StepTap(client)
    yield case, client
    client.tap.remove()
    client.close()
    loaded.close()


@dataclass(frozen=True)
class Run:
    calls: list[tuple[str, str]]  # (name, arguments) of each completed call
    text: str
    finished: Finished | None  # None: the stream was dropped after the first call
    opened: int  # calls that started (a ToolCallStart), completed or not

    @property
    def open_call(self) -> bool:
        """A call was still open when the request finished."""
        return self.finished is not None and self.opened > len(self.calls)


def calls_of(client: LocalEngineClient, choice: ToolChoice, seed: int, *, first_only: bool, max_tokens: int = 64,
             opening: str | None = None) -> Run:
    """One request sampled with `seed`; with `opening`, its output is made to open with that text."""
    request = ChatRequest(id=f"r{seed}", model="m", messages=(Message("user", "What is the weather?"),),
                          tools=TOOLS, tool_choice=choice, thinking=False,
                          sampling=SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens))
    with opened(client.tap, client, request, opening) if opening else nullcontext():
        return run(collect(client, request, first_only=first_only))


async def collect(client: LocalEngineClient, request: ChatRequest, *, first_only: bool) -> Run:
    names, calls, text, finished = {}, [], "", None
    async for event in await client.submit(request):
        if isinstance(event, ToolCallStart):
            names[event.index] = event.name
        elif isinstance(event, ToolCallEnd):
            calls.append((names[event.index], event.arguments))
            if first_only:
                break
        elif isinstance(event, TextDelta):
            text += event.text
        elif isinstance(event, Finished):
            finished = event
    return Run(calls, text, finished, len(names))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("tool", "search")], ids=["required", "named"])
def test_forced_calls_are_valid_for_every_seed(engine, choice) -> None:
    case, client = engine
    for seed in range(seeds_of(case)):
        result = calls_of(client, choice, seed, first_only=True, max_tokens=FIRST_CALL_BUDGET)
        assert result.calls, f"seed {seed}: no complete call within the budget (text {result.text!r})"
        name, arguments = result.calls[0]
        assert choice.name in (None, name), f"seed {seed}: called {name}, not the named tool"
        assert valid(TOOLS_BY_NAME[name], arguments), f"seed {seed}: invalid call {name} {arguments}"
        assert not result.text.strip(), f"seed {seed}: text {result.text!r} under tool_choice {choice.mode}"


@pytest.mark.timeout(900)
def test_auto_calls_that_start_are_valid_and_none_never_calls(engine) -> None:
    case, client = engine
    seeds = range(max(seeds_of(case) // 4, 6))
    opened_runs = 0
    for seed in seeds:
        opening = case.opening if seed % 2 else None  # every other seed is made to open a call
        opened_runs += check_auto(client, seed, opening)
        result = calls_of(client, ToolChoice("none"), seed, first_only=False, opening=opening)
        assert not result.calls and case.trigger not in result.text, (
            f"seed {seed}: a call under tool_choice none: {result.text!r}")
        assert result.finished.reason.value in ("length", "stop", "repetition")
    assert opened_runs >= len(seeds) // 2, f"only {opened_runs} of {len(seeds)} runs opened a call under auto"


def check_auto(client: LocalEngineClient, seed: int, opening: str | None) -> bool:
    """One `auto` run: every call that completes is valid; a run made to open a call completes it (it has the
    budget a first call needs). Returns whether a call opened."""
    if opening is None:
        result = calls_of(client, ToolChoice("auto"), seed, first_only=False)
        assert result.finished is not None and (not result.open_call or result.finished.reason.value == "length")
    else:
        result = calls_of(client, ToolChoice("auto"), seed, first_only=True, max_tokens=FIRST_CALL_BUDGET,
                          opening=opening)
        assert result.calls, f"seed {seed}: the opened call never completed (text {result.text!r})"
    assert all(valid(TOOLS_BY_NAME[name], arguments) for name, arguments in result.calls), f"seed {seed}: {result}"
    return result.opened > 0
