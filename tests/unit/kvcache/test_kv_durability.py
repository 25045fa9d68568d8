"""Durability, not just atomicity: the one SSD store's real write path, for both backends'
payloads, recorded step by step.

A SIGKILL never loses the page cache, so the crash test (test_kv_crash_safety.py) would pass without a single
fsync. Power loss does lose it; what survives it is what was fsynced before the step that depends on it. So
the order is pinned here by recording the calls the write path makes: the temporary blob written whole and
fsynced, renamed to its final name, the directory fsynced (the rename is on disk), and only then the index row
committed, with sqlite in synchronous=FULL (a committed row is on disk, like its blob). Dropping or reordering
any step fails a test.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.unit.kvcache.conftest import random_tokens, torch_job, torch_store
from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotStore

TOKENS = random_tokens(300)


def record_write_path(monkeypatch, store) -> list[tuple]:
    """Events, in order: ("fsync", path, size at that moment), ("rename", src, dst), ("sql", statement)."""
    events: list[tuple] = []
    fsync, replace = os.fsync, os.replace

    def recorded_fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        events.append(("fsync", path, os.fstat(fd).st_size))
        fsync(fd)

    def recorded_replace(src, dst) -> None:
        replace(src, dst)
        events.append(("rename", Path(src), Path(dst)))

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "replace", recorded_replace)
    store.index._db.set_trace_callback(lambda sql: events.append(("sql", sql.split()[0].upper())))
    return events


def assert_durable_order(events: list[tuple], blobs: Path, final: Path) -> None:
    temp = final.with_suffix(".tmp")
    steps = [e for e in events if e[0] != "sql" or e[1] in ("INSERT", "COMMIT")]
    assert [e[:3] if e[0] != "fsync" or e[1] != blobs else e[:2] for e in steps] == [
        ("fsync", temp, final.stat().st_size),  # the blob's bytes, all of them, on disk under the temporary name
        ("rename", temp, final),  # then it takes its name
        ("fsync", blobs),  # the rename itself is on disk
        ("sql", "INSERT"),  # only now can the index name it
        ("sql", "COMMIT"),
    ], steps


def assert_full_sync(store) -> None:
    assert store.index._db.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    assert store.index._db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_tensor_tier_fsyncs_blob_then_renames_then_fsyncs_the_directory_then_commits(tmp_path, monkeypatch) -> None:
    store = torch_store(tmp_path / "kv")
    assert_full_sync(store)
    events = record_write_path(monkeypatch, store)
    row = store.commit(torch_job("snap", TOKENS))
    store.index._db.set_trace_callback(None)
    assert_durable_order(events, store.blobs, store.blobs / row.blob_name)
    store.close()


def test_sequence_tier_fsyncs_blob_then_renames_then_fsyncs_the_directory_then_commits(tmp_path, monkeypatch) -> None:
    store = SnapshotStore(tmp_path / "kv-llamacpp", "layout", 1 << 30)
    assert_full_sync(store)
    events = record_write_path(monkeypatch, store)
    state = os.urandom(100_000)
    row = store.commit(SnapshotJob("snap", "ns", "m", TOKENS, 300, 1, lambda: state))
    store.index._db.set_trace_callback(None)
    final = store.blobs / row.blob_name
    assert_durable_order(events, store.blobs, final)
    store.close()
