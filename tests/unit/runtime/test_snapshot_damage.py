"""SSD-tier damage through the real stack (the engine client, its prefix cache, the SSD store on disk, a tiny
random-weight model), on both engine backends: index rows that disagree with their blobs and stray files, a blob
that changes size after the tier opened (rejected at read: the request's trace line says why), and an index
locked by another process. Each case serves two conversations, stops (the writer drains: both are on disk),
damages the tier and restarts. A snapshot is only ever out of service, never deleted for damage: the blob is kept
in quarantine/.

The damage matrix itself (a blob missing, truncated, enlarged, flipped, NaN-filled, swapped, a directory, in an old
format; a garbage or future index) runs at the cache seam on both backends: tests/unit/kvcache/test_cache_contract.py.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.backends import BACKENDS, tiny_qwen3_per_backend
from tests.support.snapshot_damage import blobs, tier_dir
from zllm.canonical import ChatRequest, Finished, Message, SamplingParams, TextDelta
from zllm.kvcache import CacheConfig, ssd_index
from zllm.runtime.client import LocalEngineClient

MODEL = "tiny"
# two conversations sharing no prefix worth a restore: the second's snapshot cannot stand in for the first's
CONVERSATIONS = (("You are a careful coding agent. Keep changes small and tested. " * 6, "Refactor module one"),
                 ("Reply as a terse reviewer would, in one line. " * 6, "Review module two"))
LATER = ("Answer as a patient maintainer would, with one example. " * 6, "Explain module three")  # asked after


BACKEND_MARKS = {getattr(b, "values", [b])[0]: getattr(b, "marks", ()) for b in BACKENDS}  # llama.cpp: skipif


@pytest.fixture(scope="module")
def served_models():
    """Per backend, the tiny model loaded once (tests/support/backends.py)."""
    yield from tiny_qwen3_per_backend()


@pytest.fixture
def start(served_models, tmp_path):
    """`start(backend, reports=[])`: an engine client with the SSD tier in tmp_path (a daemon's restart)."""
    clients = []

    def start(backend: str, reports: list | None = None) -> LocalEngineClient:
        config = CacheConfig(device_budget_bytes=64 << 20, ssd_dir=tmp_path / "kv", ssd_min_tokens=1)
        clients.append(LocalEngineClient(served_models(backend), MODEL, 1, cache_config=config,
                                         observer=reports.append if reports is not None else None))
        return clients[-1]

    yield start
    for client in clients:
        client.close()


def chat(conversation: int, rid: str) -> ChatRequest:
    system, question = (*CONVERSATIONS, LATER)[conversation]
    return ChatRequest(id=rid, model=MODEL, messages=(Message("system", system), Message("user", question)),
                       sampling=SamplingParams(temperature=0.0, max_tokens=10))


def ask(client: LocalEngineClient, request: ChatRequest) -> tuple[str, Finished]:
    async def main():
        text, finished = "", None
        async for event in await client.submit(request):
            text += event.text if isinstance(event, TextDelta) else ""
            finished = event if isinstance(event, Finished) else finished
        return text, finished
    return asyncio.run(asyncio.wait_for(main(), timeout=60))


def finished_report(reports: list, timeout: float = 10.0):
    """The last request's finished report (published on the engine thread just after its Finished event)."""
    deadline = time.monotonic() + timeout
    while not (done := [r for r in reports if r.phase == "finished"]):
        assert time.monotonic() < deadline, f"no finished report among {reports}"
        time.sleep(0.02)
    return done[-1]


def serve_and_stop(start, backend: str) -> list[str]:
    """Two conversations answered cold and written to the SSD tier; returns their answers."""
    client = start(backend)
    answers = [ask(client, chat(i, f"first-{i}"))[0] for i in range(len(CONVERSATIONS))]
    client.close()  # drains the writer: both snapshots are on disk
    return answers


def suffix(directory: Path) -> str:
    return blobs(directory)[0].suffix


def forge_first_row(directory: Path, assignments: str, *params) -> None:
    """Edit the first conversation's index row (the lowest generation), blob untouched: a forged or stale row."""
    db = sqlite3.connect(directory / "index.sqlite")
    (first,) = db.execute("SELECT min(generation) FROM snapshots").fetchone()
    db.execute(f"UPDATE snapshots SET {assignments} WHERE generation = ?", (*params, first))
    db.commit()
    db.close()


def forge_generation(directory: Path) -> None:
    """The first row and its blob renamed to sqlite's largest INTEGER: size and contents agree, the number not."""
    blob = blobs(directory)[0]
    forge_first_row(directory, "generation = ?", MAX_SQLITE)
    blob.rename(blob.with_name(f"{MAX_SQLITE:016x}{blob.suffix}"))


def second_row(directory: Path) -> tuple[str, int]:
    db = sqlite3.connect(directory / "index.sqlite")
    row = db.execute("SELECT id, length(tokens) / 4 FROM snapshots ORDER BY generation DESC LIMIT 1").fetchone()
    db.close()
    return row


MAX_SQLITE = (1 << 63) - 1
# index rows that disagree with their blobs, and a stray file: (damage, the reason the log must give once)
FORGERIES = {
    "huge-size": (lambda d: forge_first_row(d, "bytes = ?", MAX_SQLITE), "the index says 9223372036854775807"),
    "size-smaller": (lambda d: forge_first_row(d, "bytes = bytes - 1"), "the index says"),
    "size-larger": (lambda d: forge_first_row(d, "bytes = bytes + 1"), "the index says"),
    "missing-parent": (lambda d: forge_first_row(d, "parent = 'nobody', parent_len = 1"), "parent"),
    "parent-not-a-prefix": (lambda d: forge_first_row(d, "parent = ?, parent_len = min(?, length(tokens) / 4) - 1",
                                                      *second_row(d)), "parent"),
    "oversized-tokens": (lambda d: forge_first_row(d, "tokens = zeroblob(?)", 4 * ssd_index.MAX_TOKENS + 4),
                         "over 2097152 tokens"),
    "forged-generation": (forge_generation, "generation 9223372036854775807 is out of bounds"),
    "stray-max-generation": (lambda d: (d / "blobs" / f"ffffffffffffffff{suffix(d)}").write_bytes(
        blobs(d)[0].read_bytes()), "ffffffffffffffff"),
}
# (quarantined, strays) each must report (else (1, 0)); a forged generation's blob has a name out of range too
REPORTED = {"stray-max-generation": (0, 1), "forged-generation": (1, 1)}
KEPT_AS = {"stray-max-generation": "ffffffffffffffff", "forged-generation": f"{MAX_SQLITE:016x}"}  # else the blob's
FORGERY_CASES = [pytest.param(forgery, backend, id=f"{forgery}-{backend}", marks=marks)
                 for forgery in FORGERIES for backend, marks in BACKEND_MARKS.items()]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("forgery", "backend"), FORGERY_CASES)
def test_forged_rows_and_stray_files_are_reported_and_writes_go_on(start, tmp_path, forgery, backend,
                                                                   caplog) -> None:
    """A row is trusted only once it agrees with its blob (soundness.py); what is not is counted, logged once with
    why, and kept in quarantine/; the budget then counts only verified bytes, so a later write loses nothing,
    and no file name can push the next generation past what sqlite holds."""
    answers = serve_and_stop(start, backend)
    directory = tier_dir(tmp_path, backend)
    first = blobs(directory)[0].stem
    damage, reason = FORGERIES[forgery]
    damage(directory)

    with caplog.at_level(logging.WARNING, logger="zllm.kvcache"):
        restarted = start(backend)
        stats = restarted.prefix_cache.stats().ssd  # found at open, before any request
        quarantined, strays = REPORTED.get(forgery, (1, 0))
        assert (stats.quarantined, stats.strays, stats.snapshots) == (quarantined, strays, 2 - quarantined)
        assert caplog.text.count(reason) == 1, "logged once, with the reason"
        kept = [p.name for p in (directory / "quarantine").iterdir()]
        assert any(name.startswith(KEPT_AS.get(forgery, first)) for name in kept), f"not kept aside: {kept}"
        assert stats.bytes == sum(p.stat().st_size for p in blobs(directory)), "the budget counts verified bytes"
        text, _ = ask(restarted, chat(0, "again"))  # cold where its row was dropped; a stray is no snapshot
        assert text == answers[0]
        ask(restarted, chat(2, "later"))  # a new conversation: the write must go through
        restarted.close()  # drains the writer
    assert "Traceback" not in caplog.text and "writing snapshot" not in caplog.text, "a write failed"

    again = start(backend)
    for conversation in range(3):  # nothing lost to a later write's budget check, and the new one written
        text, finished = ask(again, chat(conversation, f"after-{conversation}"))
        # its own snapshot, not a few template tokens another conversation shares
        assert finished.usage.cached_tokens > finished.usage.prompt_tokens // 2, f"conversation {conversation} lost"
    assert (again.prefix_cache.stats().ssd.quarantined, again.prefix_cache.stats().ssd.strays) == (0, 0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_blob_that_changes_size_after_open_is_set_aside_at_read(start, tmp_path, backend, caplog) -> None:
    """The check at open runs again at read: a row that agreed with its blob then does not now."""
    answers = serve_and_stop(start, backend)
    directory = tier_dir(tmp_path, backend)
    reports: list = []
    restarted = start(backend, reports)
    assert restarted.prefix_cache.stats().ssd.snapshots == 2, "sound at open"
    first = blobs(directory)[0]
    first.write_bytes(first.read_bytes() + b"\0" * 64)
    with caplog.at_level(logging.WARNING, logger="zllm.kvcache"):
        text, finished = ask(restarted, chat(0, "again"))
    assert text == answers[0] and finished.usage.cached_tokens == 0
    assert "the index says" in finished_report(reports).cache_rejected, "rejected by the row check, not later"
    assert restarted.prefix_cache.stats().ssd.quarantined == 1
    assert any(p.name.startswith(first.stem) for p in (directory / "quarantine").iterdir())


LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA locking_mode=EXCLUSIVE")  # keep the lock after the write: nobody else may even read
db.execute("BEGIN EXCLUSIVE")
db.execute("UPDATE meta SET value = value")
print("locked", flush=True)
sys.stdin.read()  # hold it until the test closes our stdin
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_locked_by_another_process_turns_the_tier_off_and_is_left_alone(start, tmp_path, backend,
                                                                               monkeypatch, caplog) -> None:
    answers = serve_and_stop(start, backend)
    index = tier_dir(tmp_path, backend) / "index.sqlite"
    monkeypatch.setattr(ssd_index, "BUSY_TIMEOUT_S", 0.3)
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(index)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        with caplog.at_level(logging.WARNING, logger="zllm.kvcache"):
            restarted = start(backend)
            text, finished = ask(restarted, chat(0, "while-locked"))
        stats = restarted.prefix_cache.stats()
        assert "locked" in stats.ssd_off and "SSD tier off" in caplog.text
        assert finished.usage.cached_tokens == 0 and text == answers[0]
        restarted.close()
    finally:
        locker.stdin.close()
        locker.wait(timeout=10)
    again = start(backend)  # the other process is done: its index was neither set aside nor emptied
    text, finished = ask(again, chat(0, "after"))
    assert again.prefix_cache.stats().ssd_hits == 1 and finished.usage.cached_tokens > 0 and text == answers[0]
