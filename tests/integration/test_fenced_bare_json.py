"""A bare JSON call through the fence on a tiny RANDOM-weight model (issue 21 item 4): under `auto`, an output made
to open with `{"name": "search", "` can only go on as that call (free text may not open that way), so every seed
completes a schema-valid call whose id carries its form, and the next turn's prompt continues this turn's prompt
and output (the call rendered back bare, as written)."""

from __future__ import annotations

import pytest

from tests.support.fenced_tools import TOOLS, TOOLS_BY_NAME, run, valid
from tests.support.step_tap import StepTap, opened
from tests.support.tiny_models import tiny_qwen_dir
from zllm.canonical import (
    ChatRequest,
    Finished,
    Message,
    SamplingParams,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
)
from zllm.runtime.client import LocalEngineClient

SEEDS = 8
OPENING = '{"name": "search", "'


@pytest.fixture(scope="module")
def client():
    from zllm.engine.torch.loader import load_model

    loaded = load_model(tiny_qwen_dir(), device="cpu", dtype="float32", threads=1)
    client = LocalEngineClient(loaded, "m", 0, dialect="hermes", prefix_cache=False)
    client.tap = StepTap(client)
    yield client
    client.tap.remove()
    client.close()


def request(seed: int, *messages: Message) -> ChatRequest:
    return ChatRequest(id=f"r{seed}", model="m", messages=(Message("user", "Find the weather."), *messages),
                       tools=TOOLS, tool_choice=ToolChoice("auto"), thinking=False,
                       sampling=SamplingParams(temperature=1.0, seed=seed, max_tokens=120))


async def collect(client: LocalEngineClient, req: ChatRequest) -> tuple[list, Finished | None]:
    events = [event async for event in await client.submit(req)]
    return events, next((e for e in events if isinstance(e, Finished)), None)


@pytest.mark.timeout(600)
def test_an_opened_bare_call_completes_valid_and_the_next_turn_continues_it(client) -> None:
    for seed in range(SEEDS):
        first = request(seed)
        with opened(client.tap, client, first, OPENING):
            events, finished = run(collect(client, first))
        starts = [e for e in events if isinstance(e, ToolCallStart)]
        ends = [e for e in events if isinstance(e, ToolCallEnd)]
        assert len(starts) == len(ends) == 1, f"seed {seed}: {events}"
        assert finished is not None and finished.reason.value == "tool_calls", f"seed {seed}: {finished}"
        assert starts[0].name == "search" and valid(TOOLS_BY_NAME["search"], ends[0].arguments), events
        key = {"bja": "arguments", "bjp": "parameters"}[starts[0].id.rpartition("-")[2]]
        output = OPENING + key + '": ' + ends[0].arguments + "}"
        call = ToolCall(starts[0].id, "search", ends[0].arguments)
        second = request(seed, Message("assistant", "", tool_calls=(call,)),
                         Message("tool", "sunny", tool_call_id=call.id))
        before, after = (client.renderer.render(r).text for r in (first, second))
        assert after.startswith(before + output), f"seed {seed}: the next prompt forks from {before + output!r}"
