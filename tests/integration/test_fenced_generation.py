"""Fenced generation with tiny RANDOM-weight models, one per dialect, sampled at temperature 1 over many seeds.

Random weights know nothing about tools: whatever valid output appears is the fence's doing.
- `required` and a named tool: every seed's first call completes and is schema-valid (the stream is dropped
  right after it, which aborts the rest: a random model would go on calling until max_tokens).
- `auto`: every call that completes is valid (most seeds never start one: free text is allowed).
- `none`: no seed ever produces a call, or the dialect's call trigger in its text.
"""

from __future__ import annotations

import os

import pytest

from tests.support.fenced_tools import TOOLS, TOOLS_BY_NAME, backend_cases, load_case, run, valid
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
from zllm.runtime import LocalEngineClient

SEEDS = int(os.environ.get("ZLLM_FENCE_SEEDS", "100"))


@pytest.fixture(scope="module", params=backend_cases())
def engine(request):
    case, backend = request.param
    loaded = load_case(case, backend)
    client = LocalEngineClient(loaded, "m", 0, dialect=case.dialect, prefix_cache=False)
    yield case, client
    client.close()
    if loaded.engine is not None:
        loaded.engine.close()


async def calls_of(client: LocalEngineClient, choice: ToolChoice, seed: int, *, first_only: bool,
                   max_tokens: int = 64) -> tuple[list[tuple[str, str]], str, Finished | None, bool]:
    """(completed calls, text, Finished or None when the stream was dropped, whether a call was still open)."""
    request = ChatRequest(id=f"r{seed}", model="m", messages=(Message("user", "What is the weather?"),),
                          tools=TOOLS, tool_choice=choice, thinking=False,
                          sampling=SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens))
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
    open_call = finished is not None and len(names) > len(calls)
    return calls, text, finished, open_call


@pytest.mark.timeout(900)
@pytest.mark.parametrize("choice", [ToolChoice("required"), ToolChoice("tool", "search")], ids=["required", "named"])
def test_forced_calls_are_valid_for_every_seed(engine, choice) -> None:
    case, client = engine
    for seed in range(SEEDS):
        # room for the longest call (DSML tags are several tokens each over the V3.1 vocabulary)
        calls, text, _, _ = run(calls_of(client, choice, seed, first_only=True, max_tokens=200))
        assert calls, f"seed {seed}: no complete call within the budget (text {text!r})"
        name, arguments = calls[0]
        assert choice.name in (None, name), f"seed {seed}: called {name}, not the named tool"
        assert valid(TOOLS_BY_NAME[name], arguments), f"seed {seed}: invalid call {name} {arguments}"
        assert not text.strip(), f"seed {seed}: text {text!r} under tool_choice {choice.mode}"


@pytest.mark.timeout(900)
def test_auto_calls_that_start_are_valid_and_none_never_calls(engine) -> None:
    case, client = engine
    for seed in range(max(SEEDS // 4, 5)):
        calls, _, finished, open_call = run(calls_of(client, ToolChoice("auto"), seed, first_only=False))
        assert all(valid(TOOLS_BY_NAME[name], arguments) for name, arguments in calls), f"seed {seed}: {calls}"
        assert finished is not None and (not open_call or finished.reason.value == "length")
        calls, text, finished, _ = run(calls_of(client, ToolChoice("none"), seed, first_only=False))
        assert not calls and case.trigger not in text, f"seed {seed}: a call under tool_choice none: {text!r}"
        assert finished.reason.value in ("length", "stop", "repetition")
