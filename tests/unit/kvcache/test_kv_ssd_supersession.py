"""Supersession in the one SSD store (kvcache/snapshot_store.py): a turn's snapshot holds the whole conversation, so
when it commits, the earlier turns' snapshots (same namespace, tokens a strict prefix) are deleted — in the index
transaction that inserts it, their blobs right after, a blob a read has open once the read ends. Both payload
kinds: token-major (torch: a range is read) and whole (llama.cpp: an opaque blob read whole)."""

from __future__ import annotations

import random
import threading
from functools import partial

import pytest

from tests.unit.kvcache.conftest import assert_state_equal, random_tokens, restore_state, torch_job, torch_store
from zllm.kvcache import snapshot_frame, snapshot_store
from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotStore, blob_file

KINDS = ("token-major", "whole")


def whole_store(directory, budget_bytes: int = 1 << 30, **kwargs) -> SnapshotStore:
    """The store as llama.cpp opens it: payloads read whole (token_bytes 0)."""
    return SnapshotStore(directory, "whole-layout", budget_bytes, token_bytes=0, **kwargs)


def whole_job(job_id: str, tokens, *, namespace: str = "ns") -> SnapshotJob:
    """An opaque payload that names its tokens, so a read shows which snapshot it came from."""
    tokens = tuple(tokens)
    payload = b"state:" + ",".join(map(str, tokens)).encode()
    return SnapshotJob(job_id, namespace, "model", tokens, len(tokens), 1, partial(bytes, payload))


def open_store(kind: str, directory, **kwargs) -> SnapshotStore:
    return (torch_store if kind == "token-major" else whole_store)(directory, **kwargs)


def job(kind: str, job_id: str, tokens, **kwargs) -> SnapshotJob:
    return (torch_job if kind == "token-major" else whole_job)(job_id, tokens, **kwargs)


def conversation(turns: int, rng: random.Random) -> list[tuple[int, ...]]:
    """Each turn's sequence: the previous one plus the turn's new tokens."""
    seqs = [random_tokens(60, rng)]
    for _ in range(turns - 1):
        seqs.append(seqs[-1] + random_tokens(40, rng))
    return seqs


def blob_names(store: SnapshotStore) -> set[str]:
    return {p.name for p in store.blobs.iterdir()}


@pytest.mark.parametrize("kind", KINDS)
def test_a_turn_deletes_the_earlier_turns_it_holds(kind, tmp_path) -> None:
    store = open_store(kind, tmp_path / "kv")
    rng = random.Random(1)
    turns = conversation(4, rng)
    fork = turns[0][:40] + random_tokens(30, rng)  # an edit inside turn 1: neither holds the other
    store.commit(job(kind, "fork", fork))
    store.commit(job(kind, "other-ns", turns[0], namespace="other"))  # another caller's: never superseded
    for n, seq in enumerate(turns):
        row = store.commit(job(kind, f"t{n}", seq))
        assert sorted(r.id for r in store.snapshots()) == sorted([f"t{n}", "fork", "other-ns"])
        assert blob_names(store) == {blob_file(r.generation) for r in store.snapshots()}, "the old blob is gone"
    assert store.stats().superseded == 3 and store.stats().bytes == store.total_bytes
    # an edit of an early message finds the shared prefix in the newest turn
    match, _ = store.lookup("ns", turns[0][:55] + (4095,))
    assert (match.row.id, match.length) == ("t3", 55) and row.id == "t3"
    store.check_integrity()
    store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_read_of_a_match_superseded_after_its_lookup_reads_the_newer_snapshot(kind, tmp_path) -> None:
    store = open_store(kind, tmp_path / "kv")
    turns = conversation(2, random.Random(2))
    store.commit(job(kind, "t0", turns[0]))
    match, _ = store.lookup("ns", turns[0] + (7,))
    assert match.row.id == "t0"
    store.commit(job(kind, "t1", turns[1]))  # between the lookup and the read (a deferred read, another thread)
    payload, first, stored = store.read(match, 0)
    assert stored == len(turns[1]) and store.stats().quarantined == 0
    if kind == "token-major":
        assert_state_equal(restore_state(store, match), turns[0])
    else:
        assert bytes(payload) == b"state:" + ",".join(map(str, turns[1])).encode()
    store.check_integrity()
    store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_blob_being_read_is_deleted_when_the_read_ends(kind, tmp_path, monkeypatch) -> None:
    store = open_store(kind, tmp_path / "kv")
    turns = conversation(2, random.Random(3))
    old = store.commit(job(kind, "t0", turns[0]))
    match, _ = store.lookup("ns", turns[0] + (7,))
    reading, superseded = threading.Event(), threading.Event()
    read_payload = snapshot_frame.read_payload

    def slow_read(*args, **kwargs):
        reading.set()
        assert superseded.wait(10)
        assert (store.blobs / old.blob_name).exists(), "unlinked while a read had it open"
        return read_payload(*args, **kwargs)

    monkeypatch.setattr(snapshot_frame, "read_payload", slow_read)
    result = {}
    reader = threading.Thread(target=lambda: result.update(read=store.read(match, 0)))
    reader.start()
    assert reading.wait(10)
    store.commit(job(kind, "t1", turns[1]))  # supersedes t0 while its blob is being read
    assert [r.id for r in store.snapshots()] == ["t1"]
    superseded.set()
    reader.join(10)
    assert result["read"].stored == len(turns[0]), "the read finished on the blob it had opened"
    assert not (store.blobs / old.blob_name).exists(), "the read's end deleted it"
    store.check_integrity()
    store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_opening_deletes_snapshots_a_newer_one_holds(kind, tmp_path, monkeypatch) -> None:
    """What a crash between a deferred delete and its row leaves, or a tier written before supersession."""
    turns = conversation(3, random.Random(4))
    with monkeypatch.context() as patch:
        patch.setattr(snapshot_store, "supersedes", lambda newer, older: False)
        store = open_store(kind, tmp_path / "kv")
        for n, seq in enumerate(turns):
            store.commit(job(kind, f"t{n}", seq))
        assert len(store.snapshots()) == 3
        store.close()
    reopened = open_store(kind, tmp_path / "kv")
    assert [r.id for r in reopened.snapshots()] == ["t2"] and reopened.stats().superseded == 2
    reopened.check_integrity()  # the index and the files agree
    reopened.close()
