"""A failed SSD write leaves nothing behind, on the one store's real write path (blob_commit.py), with
both backends' payloads.

Whichever step of the commit fails — the blob write (disk full), its fsync, the rename, the directory fsync,
the index insert or its COMMIT — the temporary and the final blob are gone at once, the index and the store's
rows are as they were, and the next write succeeds. A blob no row names is disk that `zllm cache stats` does
not count (issue 20: 925 MB of them stayed until the next start). And a row the index would refuse is refused
before a byte is written.
"""

from __future__ import annotations

import builtins
import errno
import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.kvcache.conftest import random_tokens, torch_job, torch_store
from zllm.kvcache import snapshot_store
from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotStore

STEPS = ("blob-write", "blob-fsync", "rename", "dir-fsync", "index-insert", "index-commit")


@dataclass
class Tier:
    """The one store with one backend's payloads (torch's token-major tensors, or an opaque state blob)."""

    store: SnapshotStore
    payload: str  # "tensor" or "state"
    writer_module: object = snapshot_store  # the module whose `open` writes the blob

    def job(self, job_id: str, tokens: tuple[int, ...]):
        if self.payload == "tensor":
            return torch_job(job_id, tokens)
        state = os.urandom(50_000)
        return SnapshotJob(job_id, "ns", "m", tokens, len(tokens), 1, lambda: state)

    def blob_name(self, row) -> str:
        return row.blob_name

    def reopen(self):
        self.store.close()
        if self.payload == "tensor":
            return torch_store(self.store.directory)
        return SnapshotStore(self.store.directory, "layout", 1 << 30)


@pytest.fixture(params=["tensor", "state"])
def tier(request, tmp_path):
    if request.param == "tensor":
        yield Tier(torch_store(tmp_path / "kv"), "tensor")
    else:
        yield Tier(SnapshotStore(tmp_path / "kv-llamacpp", "layout", 1 << 30), "state")


class _FullDisk:
    """A file whose second write (the bulk after the header) stores part of its bytes, then fails: ENOSPC."""

    def __init__(self, f):
        self._f, self._writes = f, 0

    def write(self, data) -> int:
        self._writes += 1
        if self._writes >= 2:
            self._f.write(bytes(memoryview(data).cast("B")[:len(memoryview(data).cast("B")) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


class _FailingCommit:
    """The index's connection, but COMMIT fails as on an I/O error (and leaves the transaction open)."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def execute(self, sql: str, *args):
        if sql == "COMMIT":
            raise sqlite3.OperationalError("disk I/O error")
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


def inject(step: str, tier: Tier, monkeypatch) -> None:
    """Make `step` of the next commit fail the way a real disk or sqlite would."""
    fsync = os.fsync
    store = tier.store

    def failing_fsync(fd: int) -> None:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        if (step == "dir-fsync") == is_dir:
            raise OSError(errno.EIO, "Input/output error")
        fsync(fd)

    def failing_replace(src, dst) -> None:
        raise OSError(errno.EIO, "Input/output error")

    if step == "blob-write":
        monkeypatch.setattr(tier.writer_module, "open",
                            lambda path, mode="r", *a, **k: _FullDisk(builtins.open(path, mode, *a, **k)),
                            raising=False)
    elif step in ("blob-fsync", "dir-fsync"):
        monkeypatch.setattr(os, "fsync", failing_fsync)
    elif step == "rename":
        monkeypatch.setattr(os, "replace", failing_replace)
    elif step == "index-insert":  # sqlite refuses the statement (as a full or read-only database would)
        store.index._db.set_authorizer(
            lambda action, *_: sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_INSERT else sqlite3.SQLITE_OK)
    elif step == "index-commit":
        monkeypatch.setattr(store.index, "_db", _FailingCommit(store.index._db))


def heal(step: str, tier: Tier, monkeypatch) -> None:
    monkeypatch.undo()
    if step == "index-insert":
        tier.store.index._db.set_authorizer(None)


def assert_consistent(tier: Tier, expected_ids: set[str]) -> None:
    """Exactly the expected rows, in memory and in the index, and exactly their blobs on disk."""
    store = tier.store
    rows, bad = store.index.load()
    assert not bad
    assert {row.id for row in rows} == set(store.rows) == expected_ids
    on_disk = sorted(p.name for p in store.blobs.iterdir())
    assert on_disk == sorted(tier.blob_name(row) for row in rows), "a file no row names (or a row without one)"
    assert store.stats().snapshots == len(expected_ids)


@pytest.mark.parametrize("step", STEPS)
def test_a_commit_failing_at_any_step_leaves_no_file_and_a_consistent_tier(tier, step, monkeypatch) -> None:
    store = tier.store
    first = store.commit(tier.job("first", random_tokens(120)))
    assert first is not None
    inject(step, tier, monkeypatch)
    with pytest.raises((OSError, sqlite3.Error)):
        store.commit(tier.job("failing", tuple(range(1000, 1150))))
    heal(step, tier, monkeypatch)
    assert_consistent(tier, {"first"})
    assert store.commit(tier.job("after", tuple(range(1, 140)))) is not None, "the tier stays usable"
    assert_consistent(tier, {"first", "after"})
    tier.store = tier.reopen()  # the next start agrees: nothing to remove, nothing set aside
    assert_consistent(tier, {"first", "after"})
    assert tier.store.stats().quarantined == 0
    tier.store.close()


def test_an_impossible_row_is_refused_before_a_byte_is_written(tier, monkeypatch) -> None:
    """The original failure (issue 20): a partial prefill kept with the whole prompt's length."""
    opened: list[Path] = []
    real_open = builtins.open
    monkeypatch.setattr(tier.writer_module, "open", lambda path, *a, **k: opened.append(Path(path)) or
                        real_open(path, *a, **k), raising=False)
    job = tier.job("partial", random_tokens(100))
    object.__setattr__(job, "prompt_length", 400)  # past the dataclass's own check: the store must refuse it
    with pytest.raises((ValueError, AssertionError)):
        tier.store.commit(job)
    assert opened == [], "a blob was written for a row the index refuses"
    assert_consistent(tier, set())
    tier.store.close()
