"""A prefill-only request (canonical `prefill_only`: Anthropic `max_tokens: 0`, Responses
`prompt_cache_options.prewarm`) on both engine backends: it samples nothing, ends with PREFILLED and the prompt's
cache split, and its prompt is kept on the device tier and on SSD exactly as a finished request's terminal
state is, so the next turn (the same prompt plus a turn) reads it back, also across a restart. It is a row like
any other: an abort mid-prefill ends it with ABORT and keeps what it computed. The turn it warmed, sent before
the warm-up is done, takes its prefill over instead of computing the same prefix beside it.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.support.backends import BACKENDS, tiny_qwen3_per_backend
from tests.support.step_tap import StepTap
from zllm.cache_views import Tier
from zllm.canonical import ChatRequest, Finished, FinishReason, Message, SamplingParams, Usage
from zllm.kvcache import CacheConfig
from zllm.runtime.client import LocalEngineClient
from zllm.runtime.scheduler import SchedulerConfig

MODEL = "tiny"
CHUNK = 16  # prompt tokens per prefill step: the prompt spans several steps
SYSTEM = "You are a careful coding agent. Keep changes small, tested and explained. " * 6
TURN = (Message("system", SYSTEM), Message("user", "Fix the bug."))
NEXT_TURN = (*TURN, Message("assistant", "Done."), Message("user", "Now add a test."))


@pytest.fixture(scope="module")
def served_models():
    yield from tiny_qwen3_per_backend()


@pytest.fixture
def start(served_models, tmp_path):
    """`start(backend, reports)`: an engine client with its SSD tier in tmp_path (called again: a restart)."""
    clients = []

    def start(backend: str, reports: list) -> LocalEngineClient:
        config = CacheConfig(device_budget_bytes=64 << 20, ssd_dir=tmp_path / "kv", ssd_min_tokens=1)
        clients.append(LocalEngineClient(served_models(backend), MODEL, 1, cache_config=config,
                                         observer=reports.append,
                                         scheduler=SchedulerConfig(prefill_chunk=CHUNK, idle_prefill_chunk=CHUNK)))
        return clients[-1]

    yield start
    for client in clients:
        client.close()


def request(rid: str, messages=TURN, *, prefill_only: bool = False) -> ChatRequest:
    return ChatRequest(id=rid, model=MODEL, messages=messages, prefill_only=prefill_only,
                       sampling=SamplingParams(temperature=0.0, max_tokens=4))


def run(client: LocalEngineClient, chat: ChatRequest, *, abort_at=None) -> tuple[list, Usage]:
    """Every event of `chat`, and the prompt split its stream reported."""
    async def main():
        stream = await client.submit(chat)
        if abort_at is not None:
            abort_at.stream = stream
        events = [event async for event in stream]
        return events, await stream.prompt_usage()
    return asyncio.run(asyncio.wait_for(main(), timeout=60))


def prompt_ids(client: LocalEngineClient, messages) -> tuple[int, ...]:
    return client.renderer.render(request("probe", messages), window=client.context_length).token_ids


def shared_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def wait_finished(reports: list, request_id: str, timeout: float = 10.0) -> None:
    """The finished report is published after the request's KV was handed to the cache."""
    deadline = time.monotonic() + timeout
    while not any(r.phase == "finished" and r.request_id == request_id for r in reports):
        assert time.monotonic() < deadline, f"no finished report for {request_id}"
        time.sleep(0.02)


def entry_lengths(client: LocalEngineClient, tier: Tier) -> list[tuple[int, int]]:
    return [(e.tokens, e.prompt_tokens) for e in client.prefix_cache.entries() if e.tier is tier]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prewarm_generates_nothing_and_the_next_turn_reads_its_prompt_from_both_tiers(start, backend) -> None:
    reports: list = []
    client = start(backend, reports)
    prompt = prompt_ids(client, TURN)
    events, split = run(client, request("warm", prefill_only=True))
    assert events == [Finished(FinishReason.PREFILLED, Usage(len(prompt), 0, 0))], "no output, one Finished"
    assert events[0].usage.cache_write_tokens == len(prompt) and split == events[0].usage
    wait_finished(reports, "warm")
    assert entry_lengths(client, Tier.DEVICE) == [(len(prompt), len(prompt))], "the whole prompt, nothing else"
    client.prefix_cache.flush()
    assert entry_lengths(client, Tier.SSD) == [(len(prompt), len(prompt))]

    reuse = shared_prefix(prompt, prompt_ids(client, NEXT_TURN))
    assert reuse > len(prompt) - 8, "the next turn continues the warmed prompt (all but the generation prompt)"
    events, _ = run(client, request("next", NEXT_TURN))
    assert events[-1].usage.cached_tokens == reuse and events[-1].usage.completion_tokens > 0
    client.close()

    restarted = start(backend, reports)
    events, _ = run(restarted, request("after-restart", NEXT_TURN))
    assert events[-1].usage.cached_tokens >= reuse, "the SSD tier kept the warmed prompt across the restart"
    assert restarted.prefix_cache.stats().ssd_hits == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prewarm_aborted_mid_prefill_ends_with_abort_and_keeps_what_it_computed(start, backend) -> None:
    reports: list = []
    client = start(backend, reports)
    length = len(prompt_ids(client, TURN))
    abort = AbortAt(StepTap(client), length // 2)
    events, _ = run(client, request("warm", prefill_only=True), abort_at=abort)
    assert [type(e) for e in events] == [Finished] and events[0].reason is FinishReason.ABORT
    wait_finished(reports, "warm")
    assert length // 2 <= abort.held < length
    assert entry_lengths(client, Tier.DEVICE) == [(abort.held, abort.held)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_turn_sent_while_its_prewarm_runs_takes_the_prefill_over(start, backend) -> None:
    reports: list = []
    client = start(backend, reports)
    length = len(prompt_ids(client, TURN))
    hold = HoldAt(StepTap(client), length // 2)

    async def main():
        warm = await client.submit(request("warm", prefill_only=True))
        warmed = asyncio.create_task(drain(warm))
        assert await asyncio.to_thread(hold.landed.wait, 30)
        turn = await client.submit(request("turn", NEXT_TURN))  # queued: the prewarm's step is still running
        hold.release.set()
        return await warmed, await drain(turn)

    warm, turn = asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert warm.reason is FinishReason.PREFILLED and warm.usage.completion_tokens == 0
    assert length // 2 <= hold.held < length, "the prewarm was still prefilling when the turn arrived"
    assert turn.usage.cached_tokens == hold.held, "the turn starts from what the prewarm computed, not cold"
    wait_finished(reports, "turn")
    prefilled = {r.request_id: r.prefilled_tokens - r.cached_tokens for r in reports if r.phase == "finished"}
    assert prefilled["warm"] == 0 and prefilled["turn"] == len(prompt_ids(client, NEXT_TURN)) - hold.held


@pytest.mark.timeout(60)
def test_a_side_request_sharing_only_the_system_prompt_does_not_cut_a_prewarm_short(start) -> None:
    reports: list = []
    client = start("torch", reports)
    long_turn = (Message("system", SYSTEM), Message("user", "Fix the bug in the parser, then explain it. " * 6))
    side = (Message("system", SYSTEM), Message("user", "Write a title."))
    hold = HoldAt(StepTap(client), CHUNK)

    async def main():
        warmed = asyncio.create_task(drain(await client.submit(request("warm", long_turn, prefill_only=True))))
        assert await asyncio.to_thread(hold.landed.wait, 30)
        other = await client.submit(request("side", side))
        hold.release.set()
        return await warmed, await drain(other)

    warm, _ = asyncio.run(asyncio.wait_for(main(), timeout=60))
    length = len(prompt_ids(client, long_turn))
    assert warm.reason is FinishReason.PREFILLED and hold.held < length
    wait_finished(reports, "warm")  # the side request may finish first: the prewarm's KV is handed over after
    assert (length, length) in entry_lengths(client, Tier.DEVICE), "the prewarm ran to the end of its prompt"


async def drain(stream) -> Finished:
    return [event async for event in stream][-1]


class HoldAt:
    """A step listener that holds the first step after which a row holds `length` tokens or more until
    `release` is set (`landed`: it is holding; `held`: what the row holds then)."""

    def __init__(self, tap: StepTap, length: int):
        self.length = length
        self.held: int | None = None
        self.landed, self.release = threading.Event(), threading.Event()
        tap.listeners.append(self)

    def __call__(self, rows, lengths, outputs):
        for row, before in zip(rows, lengths):
            if self.held is None and before + len(row.token_ids) >= self.length:
                self.held = before + len(row.token_ids)
                self.landed.set()
                assert self.release.wait(30), "the test never let the step return"
        return outputs


class AbortAt:
    """A step listener that aborts `stream` inside the first step after which its row holds `length` tokens."""

    def __init__(self, tap: StepTap, length: int):
        self.length = length
        self.stream = None
        self.held: int | None = None
        tap.listeners.append(self)

    def __call__(self, rows, lengths, outputs):
        for row, before in zip(rows, lengths):
            after = before + len(row.token_ids)
            if self.held is None and self.stream is not None and after >= self.length:
                self.held = after
                self.stream.abort()
        return outputs
