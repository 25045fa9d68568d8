"""Crash safety: a writer process killed with SIGKILL at any point of a snapshot write leaves a store that opens
cleanly, shows no partial snapshot, and restores every snapshot it shows exactly.

The writer is a forked child (no interpreter start-up per trial, so many trials fit in seconds) that commits
chained snapshots under a tight size bound (so eviction's deletes get killed too). Deterministic trials kill it
at each step of the commit protocol; random trials kill it after a random delay.
"""

import os
import random
import signal
import time

import pytest

from tests.unit.kvcache.conftest import LAYOUT, assert_state_equal, random_tokens, synthetic_state
from zllm.engine.torch.cache.pool import BufferPool
from zllm.engine.torch.cache.ssd_tier import SnapshotJob, SnapshotStore, SsdMatch
from zllm.kvcache.ssd_index import unpack_tokens

BUDGET = 1 << 20  # ~20 snapshots: eviction (row delete, then file delete) runs, and gets killed, too
STAGES = ("blob-written", "blob-renamed", "dir-synced", "indexed")


def write_forever(directory, seed: int, die_at: str | None) -> None:
    """Child process body: commit snapshots until killed (or SIGKILL itself at stage `die_at`)."""
    rng = random.Random(seed)
    commits = {"n": 0}

    def hook(stage: str) -> None:
        if stage == die_at and commits["n"] >= 2:
            os.kill(os.getpid(), signal.SIGKILL)

    store = SnapshotStore(directory, LAYOUT, BUDGET, crash_hook=hook)
    stems = [random_tokens(200, rng) for _ in range(3)]
    for i in range(10_000):
        stem = rng.choice(stems)
        tokens = stem[:rng.randrange(50, 200)] + random_tokens(rng.randrange(1, 100), rng)
        store.commit(SnapshotJob(f"s{seed}-{i}", "ns", "m", tokens, len(tokens), 1,
                                 ((0, synthetic_state(tokens)),)))
        commits["n"] += 1


def run_child(directory, seed: int, die_at: str | None, kill_after: float | None) -> None:
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        try:
            write_forever(directory, seed, die_at)
        finally:
            os._exit(0)
    if kill_after is not None:
        time.sleep(kill_after)
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def assert_store_is_whole(directory) -> int:
    store = SnapshotStore(directory, LAYOUT, BUDGET)
    try:
        store.check_integrity()  # no tmp or orphan files, every row's blob validates, bytes add up
        pool = BufferPool(LAYOUT, "cpu")
        for row in store.snapshots():
            dest = LAYOUT.empty(row.length)
            store.restore(SsdMatch(row, row.length), dest, pool)
            assert_state_equal(dest, unpack_tokens(row.tokens))
        return len(store.snapshots())
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_sigkill_at_every_commit_step_and_at_random_times(tmp_path) -> None:
    directory = tmp_path / "kv"
    rng = random.Random(2024)
    seen = []
    for trial, stage in enumerate(STAGES):
        run_child(directory, trial, stage, kill_after=None)
        seen.append(assert_store_is_whole(directory))
    deadline = time.monotonic() + 10
    trial = len(STAGES)
    while time.monotonic() < deadline and trial < 60:
        run_child(directory, trial, None, kill_after=rng.uniform(0.0, 0.25))
        seen.append(assert_store_is_whole(directory))
        trial += 1
    assert trial >= 15, "too few random trials ran to mean anything"
    assert max(seen) > 0, "the writer never got a snapshot committed: the trials tested nothing"
