"""Crash safety: a writer process killed with SIGKILL at any point of a snapshot write leaves a store that opens
cleanly, shows no partial snapshot, and restores every snapshot it shows exactly.

The writer is a forked child (no interpreter start-up per trial, so many trials fit in seconds) that commits
snapshots sharing prefixes under a tight size bound (so eviction's deletes get killed too). Deterministic trials kill it
at each step of the commit protocol; random trials kill it after a random delay.
"""

import os
import random
import signal
import time

import pytest

from tests.unit.kvcache.conftest import assert_state_equal, random_tokens, restore_state, torch_job, torch_store
from zllm.kvcache.snapshot_store import SnapshotMatch, supersedes
from zllm.kvcache.ssd_index import unpack_tokens

BUDGET = 1 << 20  # ~20 snapshots: eviction (row delete, then file delete) runs, and gets killed, too
STAGES = ("blob-written", "blob-renamed", "dir-synced", "indexed", "superseded-rows")


def write_forever(directory, seed: int, die_at: str | None) -> None:
    """Child process body: commit snapshots until killed (or SIGKILL itself at stage `die_at`)."""
    rng = random.Random(seed)
    commits = {"n": 0, "extending": False}

    def hook(stage: str) -> None:  # at a commit that extends a conversation: one that supersedes its last turn
        if stage == die_at and commits["n"] >= 2 and commits["extending"]:
            os.kill(os.getpid(), signal.SIGKILL)

    store = torch_store(directory, BUDGET, crash_hook=hook)
    stems = [random_tokens(200, rng) for _ in range(3)]
    talks = list(stems)  # conversations that grow a turn at a time: each turn supersedes the one before
    for i in range(10_000):
        k = rng.randrange(len(stems))
        commits["extending"] = rng.random() < 0.6 and len(talks[k]) < 600
        if commits["extending"]:
            tokens = talks[k] = talks[k] + random_tokens(rng.randrange(1, 60), rng)
        else:  # a fork: an edit inside the stem
            tokens = stems[k][:rng.randrange(50, 200)] + random_tokens(rng.randrange(1, 100), rng)
            talks[k] = stems[k]
        store.commit(torch_job(f"s{seed}-{i}", tokens))
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
    store = torch_store(directory, BUDGET)
    try:
        store.check_integrity()  # no tmp or orphan files, every row's blob validates, bytes add up
        rows = store.snapshots()
        assert not [r.id for r in rows if any(supersedes(newer, r) for newer in rows)], "a superseded row is left"
        for row in store.snapshots():
            assert_state_equal(restore_state(store, SnapshotMatch(row, row.length)), unpack_tokens(row.tokens))
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
