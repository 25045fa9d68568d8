"""Side requests do not evict the main conversation (issue 24 item 5; the rule: zllm/kvcache/retention.py).

A coding agent interleaves short side requests (Claude Code: the title, the quota check, classifiers) with the
turns of its main conversation. Under a budget that holds one long conversation and a few side states, plain
LRU evicted the main conversation once enough side requests came after its last turn, and the next turn
prefilled its whole prompt again. With the main-conversation rule the side states go instead, on both engine
backends (the same tiny random-weight model, one thread; no SSD tier, so a cached prefix is a device-tier hit).

Budgets: llama.cpp's pool is sized at load (4096 cells: the 4096-token window, `--cache-budget-mb 1` being
fewer cells); a running turn counts its cells beside the entry it shares them with, so the main conversation
is ~1700 tokens. The torch tier gets the same room: the turn's working buffers (2048 tokens) plus ~2600 tokens
of entries. 15 side requests of ~200 tokens after a main turn overflow either.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from tests.support.backends import BACKENDS, load_tiny
from zllm.canonical import ChatRequest, Finished, Message, SamplingParams
from zllm.kvcache import CacheConfig
from zllm.runtime.client import LocalEngineClient

MODEL = "tiny"
WINDOW = 4096
TORCH_BYTES_PER_TOKEN = 512  # tiny qwen3 in float32: 2 layers x (K, V) x 2 heads x 16 dims x 4 bytes
TORCH_BUDGET = (2048 + 2600) * TORCH_BYTES_PER_TOKEN
SYSTEM = " ".join(f"Rule {i}: read tool {i % 13} output with care and keep edits small." for i in range(95))
SIDE_SYSTEM = " ".join(f"Write a short title, form {i}, five words at most." for i in range(16))
SIDES_BEFORE, SIDES_AFTER = 5, 15  # around the second main turn: 20 in all


@pytest.fixture(scope="module", params=BACKENDS)
def client(request):
    loaded = load_tiny("qwen3", request.param, context_length=WINDOW, cache_budget_mb=1)
    config = CacheConfig(device_budget_bytes=TORCH_BUDGET)  # llama.cpp's budget is its pool, sized above
    reports: list = []
    client = LocalEngineClient(replace(loaded, context_length=WINDOW), MODEL, 1, cache_config=config,
                               observer=reports.append, owns_engine=True)
    client.reports = reports
    yield client
    client.close()


def ask(client: LocalEngineClient, rid: str, messages: list[Message]) -> Finished:
    request = ChatRequest(id=rid, model=MODEL, messages=tuple(messages),
                          sampling=SamplingParams(temperature=0.0, max_tokens=4))

    async def main():
        finished = None
        async for event in await client.submit(request):
            finished = event if isinstance(event, Finished) else finished
        return finished
    return asyncio.run(asyncio.wait_for(main(), timeout=120))


def tier_of(client: LocalEngineClient, rid: str) -> str:
    """The request's cache tier, from its finished report (published once its state was handed to the cache)."""
    deadline = time.monotonic() + 10
    while not (done := [r for r in client.reports if r.phase == "finished" and r.request_id == rid]):
        assert time.monotonic() < deadline, f"no finished report for {rid}"
        time.sleep(0.02)
    return done[-1].cache_tier


def side_requests(client: LocalEngineClient, first: int, count: int) -> None:
    """Side requests that share nothing with each other (a classifier's or subagent's prompt differs early), so
    each holds ~200 tokens of its own on either tier."""
    for i in range(first, first + count):
        ask(client, f"side{i}", [Message("system", f"Side task {i}. {SIDE_SYSTEM}"),
                                 Message("user", f"Title for session {i}.")])


@pytest.mark.timeout(300)
def test_twenty_side_requests_leave_the_main_conversations_next_turn_a_device_hit(client) -> None:
    history = [Message("system", SYSTEM), Message("user", "Fix the failing test in parser.py.")]
    first = ask(client, "main1", history)
    assert 1500 <= first.usage.prompt_tokens <= 1900, "the main conversation is sized for the budget"
    side_requests(client, 0, SIDES_BEFORE)
    history += [Message("assistant", "I will read parser.py first."), Message("user", "Go on.")]
    second = ask(client, "main2", history)
    assert tier_of(client, "main2") == "device" and second.usage.cached_tokens >= first.usage.prompt_tokens
    side_requests(client, SIDES_BEFORE, SIDES_AFTER)

    history += [Message("assistant", "The parser drops the last token."), Message("user", "Then fix it.")]
    third = ask(client, "main3", history)
    assert tier_of(client, "main3") == "device", "a side request evicted the main conversation"
    assert third.usage.cached_tokens >= second.usage.prompt_tokens
    stats = client.prefix_cache.stats()
    assert stats.main_spared > 0, "the side requests did need room: the rule chose what went"
    assert stats.entries < 2 + SIDES_BEFORE + SIDES_AFTER
