"""The one SSD store (kvcache/snapshot_store.py) with the torch backend's token-major payloads: commit, prefix and
token-range restores, restart, size bound, prune, hints, reads spanning many checksum chunks."""

import random

import pytest
import torch

from tests.unit.kvcache.conftest import (
    assert_state_equal,
    random_tokens,
    restore_state,
    synthetic_state,
    torch_job,
    torch_store,
)
from zllm.kvcache import snapshot_frame

BPT = 512


@pytest.fixture
def store(tmp_path):
    s = torch_store(tmp_path / "kv")
    yield s
    s.close()


def assert_range_equal(got, tokens, low: int, high: int) -> None:
    for got_layer, want_layer in zip(got, synthetic_state(tokens)):
        for g, w in zip(got_layer, want_layer):
            assert torch.equal(g[..., low:high, :], w[..., low:high, :])


def test_commit_then_restore_any_prefix(store) -> None:
    tokens = random_tokens(300)
    row = store.commit(torch_job("a", tokens))
    assert row is not None and row.nbytes == (store.blobs / row.blob_name).stat().st_size
    match, _ = store.lookup("ns", tokens[:120] + (5,))
    assert match.row.id == "a" and match.length == 120
    assert_state_equal(restore_state(store, match), tokens, 120)
    assert store.lookup("other", tokens) == (None, None)
    store.check_integrity()


def test_a_restore_reads_only_the_token_range_it_lacks(store) -> None:
    rng = random.Random(1)
    turn1 = random_tokens(400, rng)
    turn2 = turn1[:380] + random_tokens(100, rng)  # diverges inside turn 1 (re-rendered output)
    store.commit(torch_job("t1", turn1))
    row2 = store.commit(torch_job("t2", turn2))
    assert row2.parent is None and row2.nbytes < 480 * BPT + 4096  # whole: the 480 tokens (+ header)
    match, _ = store.lookup("ns", turn2 + (1,))
    assert match.length == 480 and store.read_bytes(match, 390) == 90 * BPT
    payload, first, _ = store.read(match, 390)
    assert (len(payload), first) == (90 * BPT, 390), "only [390, 480) was returned"
    assert_range_equal(restore_state(store, match, skip=390), turn2, 390, 480)
    assert_state_equal(restore_state(store, match), turn2)
    store.check_integrity()


def test_covered_sequences_are_not_written_twice(store) -> None:
    tokens = random_tokens(200)
    store.commit(torch_job("a", tokens))
    assert store.commit(torch_job("b", tokens[:150])) is None
    assert store.commit(torch_job("a", tokens)) is None
    assert [r.id for r in store.snapshots()] == ["a"]


def test_snapshots_survive_reopening(tmp_path) -> None:
    tokens = random_tokens(250)
    first = torch_store(tmp_path / "kv")
    first.commit(torch_job("a", tokens))
    first.close()
    reopened = torch_store(tmp_path / "kv")
    match, _ = reopened.lookup("ns", tokens + (1,))
    assert_state_equal(restore_state(reopened, match), tokens)
    reopened.check_integrity()
    reopened.close()


def test_size_bound_evicts_least_recently_used(tmp_path) -> None:
    store = torch_store(tmp_path / "kv", 3 * 100 * BPT + 3 * 4096)
    rng = random.Random(2)
    seqs = [random_tokens(100, rng) for _ in range(4)]
    for i, seq in enumerate(seqs[:3]):
        store.commit(torch_job(f"s{i}", seq))
    restore_state(store, store.lookup("ns", seqs[0])[0])  # s0 used: s1 is now the least recently used
    store.commit(torch_job("s3", seqs[3]))
    assert sorted(r.id for r in store.snapshots()) == ["s0", "s2", "s3"]
    assert store.total_bytes <= store.budget_bytes
    store.check_integrity()
    store.close()


def test_prune_by_namespace_age_and_size(store) -> None:
    rng = random.Random(3)
    a = random_tokens(100, rng)
    store.commit(torch_job("a1", a, namespace="n1"))
    store.commit(torch_job("a2", a[:60] + random_tokens(80, rng), namespace="n1"))  # a fork: a1 stays
    store.commit(torch_job("b", random_tokens(100, rng), namespace="n2"))
    assert sorted(store.prune(namespace="n1")) == ["a1", "a2"]
    assert store.prune(older_than_s=3600) == []
    assert store.prune(max_bytes=0) == ["b"]
    assert store.snapshots() == []
    store.check_integrity()


def test_exact_id_and_client_key_hints(store) -> None:
    tokens = random_tokens(100)
    store.commit(torch_job("resp_1", tokens, hint_key="session-7"))
    for hint in ("resp_1", "session-7"):
        match, _ = store.lookup("ns", tokens + (1,), hint)
        assert match.hinted and match.length == 100
    match, _ = store.lookup("ns", tokens[:50], "resp_1")  # a hint that is not a prefix is not trusted
    assert not match.hinted and match.length == 50


@pytest.mark.parametrize(("chunk_bytes", "skip"), [(1000, 0), (1000, 390), (512, 10), (40_000, 300), (7, 899)])
def test_reads_spanning_many_chunks_land_every_token(tmp_path, monkeypatch, chunk_bytes, skip) -> None:
    """A range read checks the whole chunks covering it and returns only its part, chunk edges anywhere."""
    monkeypatch.setattr(snapshot_frame, "CHUNK_BYTES", chunk_bytes)
    store = torch_store(tmp_path / "kv")
    tokens = random_tokens(950, random.Random(2))
    store.commit(torch_job("t", tokens))
    match, _ = store.lookup("ns", tokens[:900] + (1,))
    assert match.length == 900
    assert_range_equal(restore_state(store, match, skip=skip), tokens, skip, 900)
    store.check_integrity()
    store.close()
