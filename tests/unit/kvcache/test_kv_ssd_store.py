"""SSD tier store: commit, chained turns, prefix restores, restart, size bound, prune, listing."""

import random

import pytest
import torch

from tests.unit.kvcache.conftest import LAYOUT, assert_state_equal, random_tokens, synthetic_state
from zllm.engine.torch.cache import ssd_format
from zllm.engine.torch.cache.pool import BufferPool
from zllm.engine.torch.cache.ssd_tier import SnapshotJob, SnapshotStore, SsdMatch

BPT = 512


def job(tokens, rid: str, *, namespace="ns", prompt_length=None, round_=1) -> SnapshotJob:
    tokens = tuple(tokens)
    return SnapshotJob(rid, namespace, "model", tokens, len(tokens) if prompt_length is None else prompt_length,
                       round_, ((0, synthetic_state(tokens)),))


def restore(store: SnapshotStore, match: SsdMatch, *, skip: int = 0):
    dest = LAYOUT.empty(match.length + 8)
    store.restore(match, dest, BufferPool(LAYOUT, "cpu"), skip=skip)
    return dest


@pytest.fixture
def store(tmp_path):
    s = SnapshotStore(tmp_path / "kv", LAYOUT, 1 << 30)
    yield s
    s.close()


def test_commit_then_restore_any_prefix(store) -> None:
    tokens = random_tokens(300)
    row = store.commit(job(tokens, "a"))
    assert row is not None and row.nbytes == (store.blobs / row.blob_name).stat().st_size
    match, _ = store.lookup("ns", tokens[:120] + (5,))
    assert match.row.id == "a" and match.length == 120
    assert_state_equal(restore(store, match), tokens, 120)
    assert store.lookup("other", tokens) == (None, None)
    store.check_integrity()


def test_turns_chain_to_their_parent_and_store_only_new_tokens(store) -> None:
    rng = random.Random(1)
    turn1 = random_tokens(400, rng)
    turn2 = turn1[:380] + random_tokens(100, rng)  # diverges inside turn 1 (re-rendered output)
    store.commit(job(turn1, "t1"))
    row2 = store.commit(job(turn2, "t2"))
    assert (row2.parent, row2.parent_len) == ("t1", 380)
    assert row2.nbytes < 101 * BPT + 4096  # its own 100 tokens (+ header)
    match, _ = store.lookup("ns", turn2 + (1,))
    assert match.length == 480
    assert_state_equal(restore(store, match), turn2)
    dest = LAYOUT.empty(490)
    store.restore(match, dest, BufferPool(LAYOUT, "cpu"), skip=390)  # reads only [390, 480), from t2's blob
    want = synthetic_state(turn2)
    for got_layer, want_layer in zip(dest, want):
        for got, expected in zip(got_layer, want_layer):
            assert torch.equal(got[..., 390:480, :], expected[..., 390:480, :])
    store.check_integrity()


def test_covered_sequences_are_not_written_twice(store) -> None:
    tokens = random_tokens(200)
    store.commit(job(tokens, "a"))
    assert store.commit(job(tokens[:150], "b")) is None
    assert store.commit(job(tokens, "a")) is None
    assert [r.id for r in store.snapshots()] == ["a"]


def test_snapshots_survive_reopening(tmp_path) -> None:
    tokens = random_tokens(250)
    first = SnapshotStore(tmp_path / "kv", LAYOUT, 1 << 30)
    first.commit(job(tokens, "a"))
    first.close()
    reopened = SnapshotStore(tmp_path / "kv", LAYOUT, 1 << 30)
    match, _ = reopened.lookup("ns", tokens + (1,))
    assert_state_equal(restore(reopened, match), tokens)
    reopened.check_integrity()
    reopened.close()


def test_size_bound_evicts_least_recently_used_leaves(tmp_path) -> None:
    store = SnapshotStore(tmp_path / "kv", LAYOUT, 3 * 100 * BPT + 3 * 4096)
    rng = random.Random(2)
    seqs = [random_tokens(100, rng) for _ in range(4)]
    for i, seq in enumerate(seqs[:3]):
        store.commit(job(seq, f"s{i}"))
    restore(store, store.lookup("ns", seqs[0])[0])  # s0 used: s1 is now the least recently used
    store.commit(job(seqs[3], "s3"))
    assert sorted(r.id for r in store.snapshots()) == ["s0", "s2", "s3"]
    assert store.total_bytes <= store.budget_bytes
    store.check_integrity()
    store.close()


def test_a_parent_is_evicted_only_after_its_children(tmp_path) -> None:
    store = SnapshotStore(tmp_path / "kv", LAYOUT, 1 << 30)
    base = random_tokens(200)
    store.commit(job(base, "parent"))
    store.commit(job(base + random_tokens(50, random.Random(1)), "child"))
    assert store.evict_to_budget(store.total_bytes - 1) == ["child"]
    assert store.evict_to_budget(0) == ["parent"]
    store.check_integrity()
    store.close()


def test_prune_by_namespace_age_and_size(store) -> None:
    rng = random.Random(3)
    a = random_tokens(100, rng)
    store.commit(job(a, "a1", namespace="n1"))
    store.commit(job(a + random_tokens(80, rng), "a2", namespace="n1"))
    store.commit(job(random_tokens(100, rng), "b", namespace="n2"))
    assert sorted(store.prune(namespace="n1")) == ["a1", "a2"]
    assert store.prune(older_than_s=3600) == []
    assert store.prune(max_bytes=0) == ["b"]
    assert store.snapshots() == []
    store.check_integrity()


def test_exact_id_and_client_key_hints(store) -> None:
    tokens = random_tokens(100)
    store.commit(SnapshotJob("resp_1", "ns", "m", tokens, 100, 1, ((0, synthetic_state(tokens)),), "session-7"))
    for hint in ("resp_1", "session-7"):
        match, _ = store.lookup("ns", tokens + (1,), hint)
        assert match.hinted and match.length == 100
    match, _ = store.lookup("ns", tokens[:50], "resp_1")  # a hint that is not a prefix is not trusted
    assert not match.hinted and match.length == 50


@pytest.mark.parametrize(("piece_bytes", "skip"), [(1, 0), (1, 390), (1, 10), (40_000, 300)])
def test_restores_read_in_many_pieces_land_every_token(tmp_path, monkeypatch, piece_bytes, skip) -> None:
    """A restore reads each tensor in pieces of whole checksum chunks (one chunk per piece with a tiny
    PIECE_BYTES); pieces that straddle the restored range's ends copy only their part, to the right place."""
    monkeypatch.setattr(ssd_format, "PIECE_BYTES", piece_bytes)
    store = SnapshotStore(tmp_path / "kv", LAYOUT, 1 << 30)
    rng = random.Random(2)
    turn1 = random_tokens(700, rng)
    turn2 = turn1[:650] + random_tokens(300, rng)  # chained: restores read from two blobs
    store.commit(job(turn1, "t1"))
    store.commit(job(turn2, "t2"))
    match, _ = store.lookup("ns", turn2[:900] + (1,))
    assert match.length == 900
    dest = LAYOUT.empty(910)
    store.restore(match, dest, BufferPool(LAYOUT, "cpu"), skip=skip)
    want = synthetic_state(turn2)
    for got_layer, want_layer in zip(dest, want):
        for got, expected in zip(got_layer, want_layer):
            assert torch.equal(got[..., skip:900, :], expected[..., skip:900, :])
    store.close()
