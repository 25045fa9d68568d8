"""Aborted requests keep what they computed, on both tiers and both engine backends (issue 20).

A client that gives up on a slow prefill (Claude Code's idle watchdog, a user's Ctrl-C) aborts its request part
way; the KV already computed is a real cache entry: on the device tier at once, on the SSD tier once the writer
ran (also across a restart), with no traceback and no blob file the index does not name. The retry the client
sends right away finds that prefix, not the older one the aborted request started from.

Timing is made deterministic with a tap on the engine step (tests/support/step_tap.py): the abort is raised
inside the step that brings the prefill to the wanted length (or at the wanted decode / verify step), and the
engine loop sees it before its next step. A small prefill chunk makes the prompt span many steps.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from tests.support.backends import BACKENDS, tiny_qwen3_per_backend
from tests.support.step_tap import StepTap, forced_opening
from zllm.cache_views import Tier
from zllm.canonical import ChatRequest, Finished, FinishReason, Message, SamplingParams
from zllm.kvcache import CacheConfig
from zllm.runtime.client import LocalEngineClient
from zllm.runtime.scheduler import SchedulerConfig

MODEL = "tiny"
CHUNK = 16  # prompt tokens per prefill step: a ~300-token prompt spans ~20 steps
SYSTEM = ("You are a careful coding agent. Keep changes small, tested and explained. "
          "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
          "upsilon phi chi psi omega. ") * 5
ECHO = " beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma"


@pytest.fixture(scope="module")
def served_models():
    """Per backend, the tiny model loaded once (tests/support/backends.py)."""
    yield from tiny_qwen3_per_backend()


@pytest.fixture
def start(served_models, tmp_path):
    """`start(backend, reports, speculative=False)`: an engine client with its SSD tier in tmp_path (called again:
    a daemon's restart)."""
    clients = []

    def start(backend: str, reports: list, *, speculative: bool = False) -> LocalEngineClient:
        config = CacheConfig(device_budget_bytes=64 << 20, ssd_dir=tmp_path / "kv", ssd_min_tokens=1)
        clients.append(LocalEngineClient(served_models(backend), MODEL, 1, cache_config=config,
                                         observer=reports.append, speculative=speculative,
                                         scheduler=SchedulerConfig(prefill_chunk=CHUNK, idle_prefill_chunk=CHUNK)))
        return clients[-1]

    yield start
    for client in clients:
        client.close()


def chat(rid: str, max_tokens: int = 8) -> ChatRequest:
    return ChatRequest(id=rid, model=MODEL, messages=(Message("system", SYSTEM), Message("user", "Fix the bug.")),
                       sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens))


class AbortAt:
    """A step listener that aborts `stream` inside the first step after which its row holds `length` tokens or
    more (`verify`: inside the first speculative verify step instead); `held` is what the row held then."""

    def __init__(self, tap: StepTap, length: int | None = None, *, verify: bool = False):
        self.length, self.verify = length, verify
        self.stream = None
        self.held: int | None = None
        self.landed = threading.Event()  # the abort is raised (the step has not returned yet)
        self.release = threading.Event()  # the step may return
        self.release.set()
        tap.listeners.append(self)

    def __call__(self, rows, lengths, outputs):
        for row, before in zip(rows, lengths):
            after = before + len(row.token_ids)
            # a verify feeds the last token and its draft (a speculating row's plain step feeds one token)
            hit = len(row.token_ids) > 1 and row.all_logits if self.verify else after >= self.length
            if self.held is None and self.stream is not None and hit:
                self.held = after
                self.stream.abort()
                self.landed.set()
                assert self.release.wait(30), "the test never let the step return"
        return outputs


async def drain(stream) -> Finished:
    finished = None
    async for event in stream:
        finished = event if isinstance(event, Finished) else finished
    return finished


def ask(client: LocalEngineClient, request: ChatRequest) -> Finished:
    async def main():
        return await drain(await client.submit(request))
    return asyncio.run(asyncio.wait_for(main(), timeout=60))


def run_aborted(client: LocalEngineClient, abort: AbortAt, request: ChatRequest) -> Finished:
    async def main():
        abort.stream = await client.submit(request)
        return await drain(abort.stream)
    finished = asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert finished.reason is FinishReason.ABORT and abort.held is not None
    return finished


def prompt_length(client: LocalEngineClient, request: ChatRequest) -> int:
    return asyncio.run(asyncio.wait_for(client.count_tokens(request), timeout=60))


def wait_finished(reports: list, request_id: str, timeout: float = 10.0):
    """The request's finished report: published on the engine thread after its KV was handed to the cache."""
    deadline = time.monotonic() + timeout
    while not (done := [r for r in reports if r.phase == "finished" and r.request_id == request_id]):
        assert time.monotonic() < deadline, f"no finished report for {request_id} among {reports}"
        time.sleep(0.02)
    return done[-1]


def tier_dir(tmp_path: Path, backend: str) -> Path:
    return tmp_path / ("kv" if backend == "torch" else f"kv-{backend}")  # runtime/prefix.py names them so


def unindexed_files(directory: Path) -> list[str]:
    """Files in the tier's blobs/ that no index row names (temps included)."""
    db = sqlite3.connect(f"file:{directory / 'index.sqlite'}?mode=ro", uri=True)
    try:
        generations = {g for (g,) in db.execute("SELECT generation FROM snapshots")}
    finally:
        db.close()
    return [p.name for p in (directory / "blobs").iterdir()
            if p.suffix == ".tmp" or int(p.stem, 16) not in generations]


def entry_lengths(client: LocalEngineClient, tier: Tier) -> list[tuple[int, int]]:
    """(tokens, prompt tokens) of each of the cache's entries on `tier`."""
    return [(e.tokens, e.prompt_tokens) for e in client.prefix_cache.entries() if e.tier is tier]


def assert_quiet(caplog) -> None:
    """No traceback and no error in the daemon's log (issue 20: `ValueError: bad generation, size or round`)."""
    loud = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not loud, [r.getMessage() for r in loud]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prefill_aborted_part_way_is_kept_on_the_device_and_on_ssd_across_a_restart(
        start, tmp_path, backend, fraction, caplog) -> None:
    reports: list = []
    client = start(backend, reports)
    length = prompt_length(client, chat("probe"))
    abort = AbortAt(StepTap(client), round(fraction * length))
    with caplog.at_level(logging.WARNING, logger="zllm"):
        run_aborted(client, abort, chat("aborted"))
        wait_finished(reports, "aborted")
        computed = abort.held
        assert fraction * length <= computed < length, "the abort landed mid-prefill"
        assert entry_lengths(client, Tier.DEVICE) == [(computed, computed)], "the computed prefix, all prompt"
        client.prefix_cache.flush()  # the writer ran
        assert entry_lengths(client, Tier.SSD) == [(computed, computed)]
        assert unindexed_files(tier_dir(tmp_path, backend)) == []
        client.close()

        restarted = start(backend, reports)
        finished = ask(restarted, chat("after-restart"))
        assert finished.usage.cached_tokens == computed, "the restart lost the aborted prefill"
        assert restarted.prefix_cache.stats().ssd_hits == 1
        restarted.close()
    assert unindexed_files(tier_dir(tmp_path, backend)) == []
    assert_quiet(caplog)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_retry_sent_while_the_abort_lands_finds_the_aborted_prefill(start, backend, caplog) -> None:
    """The retry reaches the engine while the aborted request's last step still runs: its lookup must wait for
    that request to end (one step), not find the cache as it was when the aborted request started."""
    reports: list = []
    client = start(backend, reports)
    length = prompt_length(client, chat("probe"))
    abort = AbortAt(StepTap(client), length // 2)
    abort.release.clear()  # hold the step in which the abort lands until the retry is queued

    async def main():
        abort.stream = await client.submit(chat("aborted"))
        aborted = asyncio.create_task(drain(abort.stream))
        assert await asyncio.to_thread(abort.landed.wait, 30)
        retry = await client.submit(chat("retry"))  # queued: the engine thread is still inside the step
        abort.release.set()
        return await aborted, await drain(retry)

    with caplog.at_level(logging.WARNING, logger="zllm"):
        first, retried = asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert first.reason is FinishReason.ABORT and retried.reason is not FinishReason.ABORT
    assert retried.usage.cached_tokens == abort.held, "the retry raced the abort instead of finding its prefix"
    assert wait_finished(reports, "retry").cache_tier == "device"
    assert_quiet(caplog)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stage", ["first-token", "decode", "speculative-verify"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_abort_after_the_prefill_keeps_the_prompt_and_what_was_fed(start, tmp_path, backend, stage,
                                                                     caplog) -> None:
    """After the prefill, the kept sequence is the prompt and every generated token fed forward: after the first
    token's step, a later decode step, or a speculative verify step (its drafts resolved and cropped first)."""
    reports: list = []
    client = start(backend, reports, speculative=stage == "speculative-verify")
    length = prompt_length(client, chat("probe"))
    tap = StepTap(client)
    echo = client.loaded.tokenizer.encode(ECHO, add_special_tokens=False)
    if stage == "speculative-verify":
        abort = AbortAt(tap, verify=True)
    else:
        abort = AbortAt(tap, length + (1 if stage == "first-token" else 4))
    with caplog.at_level(logging.WARNING, logger="zllm"), forced_opening(tap, length, echo):
        finished = run_aborted(client, abort, chat("aborted", max_tokens=len(echo)))
        wait_finished(reports, "aborted")
        # the abort came between steps: every token generated so far was fed (a step feeds the token it
        # sampled, and a verify its sampled token with the draft, cropped back to the accepted part)
        kept = length + finished.usage.completion_tokens
        if stage == "speculative-verify":
            assert length + 1 < kept <= abort.held, "the verify's drafts were not resolved before the retire"
        else:
            assert kept == abort.held
        assert entry_lengths(client, Tier.DEVICE) == [(kept, length)]
        client.prefix_cache.flush()
        assert entry_lengths(client, Tier.SSD) == [(kept, length)]
        again = ask(client, chat("again"))
    assert again.usage.cached_tokens == length - 1, "a hit covers the prompt but its last token"
    client.prefix_cache.check_integrity()
    assert unindexed_files(tier_dir(tmp_path, backend)) == []
    assert_quiet(caplog)
