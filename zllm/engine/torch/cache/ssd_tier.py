"""The SSD tier: snapshots that survive restarts, in `<cache_dir>/kv/` (index.sqlite + blobs/ + quarantine/).

Commit protocol (kill -9 at any instant leaves the old or the new state, never a half snapshot):

    1. write blobs/<gen>.tmp and fsync it            a crash here leaves a .tmp: deleted on open
    2. rename to blobs/<gen>.safetensors, fsync dir   a crash here leaves an orphan blob: deleted on open
    3. insert the index row (one sqlite transaction)  only now can a lookup see the snapshot
    Deletion runs the other way round: row first, then the file. A step that fails with an error (not a
    crash) removes what was written at once (blob_commit.py): no orphan blob waits for the next start.

Reads treat disk as untrusted (the row must still agree with its blob, soundness.py, as at open; ssd_format.py
validates every blob before anything is allocated for it, and checks every tensor chunk's checksum before it
is copied); a snapshot that fails is quarantined with its descendants and the lookup is a miss, never a
crash. An index that is garbage or from a newer zllm is set aside at open (ssd_index.open_index) and the tier
starts empty.

Lookups are per namespace over the in-memory mirror of the index: an exact id / client key hint (verified:
its tokens must be a prefix of the request), else the snapshot sharing the longest prefix with the request
(a prefix of any snapshot is restorable, because a blob stores tokens token-major).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from zllm.engine.torch.cache.pool import BufferPool
from zllm.engine.torch.cache.ssd_format import SnapshotInvalid, read_header, read_range_into, staging_bytes, write_blob
from zllm.engine.torch.cache.ssd_maintenance import Maintenance
from zllm.engine.torch.cache.state import KVLayout, KVState, common_prefix_length, seq_len, slice_state
from zllm.kvcache.blob_commit import commit_blob
from zllm.kvcache.ssd_index import SnapshotRow, blob_name, open_index, pack_tokens, token_sha256
from zllm.private_files import private_dir

log = logging.getLogger("zllm.kvcache")

MIN_PARENT_TOKENS = 64  # sharing fewer tokens with an existing snapshot is not worth a chain link
MAX_CHAIN_DEPTH = 64  # deeper chains are cut by writing the full sequence (bounds files opened per restore)


@dataclass(frozen=True)
class SsdMatch:
    row: SnapshotRow
    length: int  # tokens to restore: a prefix of row's sequence
    hinted: bool = False


@dataclass(frozen=True)
class SnapshotJob:
    """A terminal state handed to the writer. `sources` are (start, KV span) pieces covering [0, n) in order;
    the engine thread no longer mutates them (tree node spans or a clone)."""

    id: str
    namespace: str
    model: str
    tokens: tuple[int, ...]
    prompt_length: int
    round: int
    sources: tuple[tuple[int, KVState], ...]
    hint_key: str | None = None

    def __post_init__(self) -> None:
        assert self.tokens and self.round >= 1 and 0 <= self.prompt_length <= len(self.tokens)
        cursor = 0
        for start, span in self.sources:
            assert start == cursor, "sources tile [0, n) in order"
            cursor += seq_len(span)
        assert cursor >= len(self.tokens), "sources cover the tokens"


class SnapshotStore(Maintenance):
    def __init__(self, directory: Path, layout: KVLayout, budget_bytes: int,
                 *, crash_hook: Callable[[str], None] | None = None):
        self.directory = Path(directory)
        self.layout = layout
        self.budget_bytes = budget_bytes
        self.blobs = self.directory / "blobs"
        self.quarantine_dir = self.directory / "quarantine"
        for d in (self.directory, self.blobs, self.quarantine_dir):
            private_dir(d)  # snapshots decode back to prompts: this user's only
        self._crash_hook = crash_hook or (lambda stage: None)
        self._lock = threading.RLock()
        self._pinned: dict[str, int] = {}  # rows being read or used as a parent: never deleted meanwhile
        self._touched: set[str] = set()  # rows whose last_used/hits changed since the last flush
        self.index, index_set_aside = open_index(self.directory / "index.sqlite", self.quarantine_dir)
        self.rows: dict[str, SnapshotRow] = {}
        self.counters = {"writes": 0, "writes_skipped": 0, "restores": 0, "quarantined": 0, "evicted": 0,
                         "index_set_aside": int(index_set_aside is not None)}
        self._recover()

    # ------------------------------------------------------------------ lookup and restore (engine thread)

    def lookup(self, namespace: str, tokens: tuple[int, ...], hint: str | None = None,
               ) -> tuple[SsdMatch | None, SsdMatch | None]:
        """(best restorable match, best diverging snapshot by shared fraction — for the near-miss log)."""
        packed = pack_tokens(tokens)
        with self._lock:
            rows = self.rows.candidates(namespace, packed)  # only rows that can share a useful prefix
        if hint:
            hinted = self._hinted(rows, hint)
            if hinted is not None and packed.startswith(hinted.tokens):
                return SsdMatch(hinted, hinted.length, hinted=True), None
        best = diverged = None
        for row in rows:
            shared = common_prefix_length(row.tokens, packed) // 4
            if shared and (best is None or shared > best.length):
                best = SsdMatch(row, shared)
            if 0 < shared < row.length and (diverged is None or shared / row.length > diverged.length / diverged.row.length):
                diverged = SsdMatch(row, shared)
        return best, diverged

    def restore(self, match: SsdMatch, dest: KVState, pool: BufferPool, *, skip: int = 0) -> int:
        """Copy the match's tokens [skip, length) into dest (the first `skip` are there already); returns bytes
        read. Raises SnapshotInvalid (after quarantining the bad snapshot) when a blob of the chain is bad."""
        assert 0 <= skip < match.length
        segments = self._segments(match.row, match.length, skip)
        ids = [row.id for row, _, _, _ in segments]
        self._pin(ids)
        try:
            self._read_segments(segments, dest, pool)
        finally:
            self._unpin(ids)
        now = time.time()
        with self._lock:
            for row_id in ids:
                if row_id in self.rows:
                    row = self.rows[row_id]
                    self.rows[row_id] = replace(row, last_used=now, hits=row.hits + (row_id == match.row.id))
                    self._touched.add(row_id)
            self.counters["restores"] += 1
        return (match.length - skip) * self.layout.bytes_per_token

    # ------------------------------------------------------------------ commit (writer thread)

    def commit(self, job: SnapshotJob) -> SnapshotRow | None:
        """Write `job` durably (new tokens only, chained to the snapshot sharing the longest prefix)."""
        packed = pack_tokens(job.tokens)
        with self._lock:
            if job.id in self.rows or self._covered(job.namespace, packed):
                self.counters["writes_skipped"] += 1  # already covered by a snapshot
                return None
            parent, shared = self._best_parent(job.namespace, packed)
            generation = self._next_generation
            self._next_generation += 1
            if parent is not None:
                self._pin([parent.id])
        try:
            row = self._write(job, packed, parent, shared, generation)
        finally:
            if parent is not None:
                self._unpin([parent.id])
        self.evict_to_budget()
        return row

    def _write(self, job: SnapshotJob, packed: bytes, parent: SnapshotRow | None, shared: int,
               generation: int) -> SnapshotRow | None:
        own = _gather(job.sources, shared, len(job.tokens))  # [1, kv_heads, n - shared, head_dim] per tensor
        final = self.blobs / blob_name(generation)
        now = time.time()
        # built, and so checked, before a byte is written; its size is filled in once the blob is written
        row = SnapshotRow(job.id, job.namespace, job.model, parent.id if parent else None, shared, packed,
                          generation, 1, job.round, job.prompt_length, job.hint_key, now, now)
        return commit_blob(final.with_suffix(".tmp"), final,
                           lambda temp: write_blob(temp, own, self.layout, token_sha256(packed[4 * shared:])),
                           lambda size: self._index(replace(row, nbytes=size), parent), self._crash_hook)

    def _index(self, row: SnapshotRow, parent: SnapshotRow | None) -> SnapshotRow | None:
        """Insert the row of a durable blob (None: its parent was pruned meanwhile — pins stop eviction only —
        and commit_blob removes the blob)."""
        with self._lock:
            if parent is not None and parent.id not in self.rows:
                return None
            self.index.insert(row)
            self._crash_hook("indexed")
            self.rows[row.id] = row
            self.counters["writes"] += 1
        return row

    # ------------------------------------------------------------------ internals

    def _hinted(self, rows: list[SnapshotRow], hint: str) -> SnapshotRow | None:
        by_id = [r for r in rows if r.id == hint]
        by_key = sorted((r for r in rows if r.hint_key == hint), key=lambda r: r.created)
        return by_id[0] if by_id else (by_key[-1] if by_key else None)

    def _covered(self, namespace: str, packed: bytes) -> bool:
        return any(r.namespace == namespace and r.tokens.startswith(packed) for r in self.rows.values())

    def _best_parent(self, namespace: str, packed: bytes) -> tuple[SnapshotRow | None, int]:
        best, best_shared = None, 0
        for row in self.rows.values():
            if row.namespace != namespace or self._depth(row) >= MAX_CHAIN_DEPTH:
                continue
            shared = common_prefix_length(row.tokens, packed) // 4
            if shared > best_shared:
                best, best_shared = row, shared
        if best is None or best_shared < MIN_PARENT_TOKENS:
            return None, 0
        return best, best_shared

    def _depth(self, row: SnapshotRow) -> int:
        depth = 1
        while row.parent is not None and row.parent in self.rows:
            row, depth = self.rows[row.parent], depth + 1
        return depth

    def _segments(self, row: SnapshotRow, length: int, skip: int) -> list[tuple[SnapshotRow, int, int, int]]:
        """(row, first token in its blob, count, destination start) per blob read, newest blob first.

        A row's blob holds global tokens [parent_len, length); the rest come from its parent chain.
        """
        segments = []
        with self._lock:
            high = length
            while high > skip:
                low = max(row.parent_len, skip)
                if high > low:
                    segments.append((row, low - row.parent_len, high - low, low))
                high = min(high, row.parent_len)
                if high > skip:
                    parent = self.rows.get(row.parent or "")
                    if parent is None:
                        raise SnapshotInvalid(f"snapshot {row.id} lost its parent {row.parent}")
                    row = parent
        return segments

    def _read_segments(self, segments: list[tuple[SnapshotRow, int, int, int]], dest: KVState,
                       pool: BufferPool) -> None:
        opened: list[tuple[object, object]] = []
        current = segments[0][0]
        try:
            for current, _, _, _ in segments:  # validate every blob of the chain before reading any data
                f = open(self.blobs / current.blob_name, "rb")
                opened.append((f, None))
                size = os.fstat(f.fileno()).st_size
                with self._lock:  # the row is trusted only while it still agrees with its blob (soundness.py)
                    if (reason := self.check(current, self.rows, size)) is not None:
                        raise SnapshotInvalid(reason)
                header = read_header(f, size, self.layout, current.own_length, current.own_token_sha256)
                opened[-1] = (f, header)
            staging = pool.staging(max(staging_bytes(header, first, count)
                                       for (_, header), (_, first, count, _) in zip(opened, segments)))
            for (f, header), (current, first, count, start) in zip(opened, segments):
                read_range_into(f, header, first, count, dest, start, self.layout, staging)
        except (OSError, SnapshotInvalid) as exc:
            self.quarantine(current.id, str(exc))
            raise SnapshotInvalid(f"snapshot {current.id}: {exc}") from exc
        finally:
            for f, _ in opened:
                f.close()

    def _pin(self, ids: list[str]) -> None:
        with self._lock:
            for row_id in ids:
                self._pinned[row_id] = self._pinned.get(row_id, 0) + 1

    def _unpin(self, ids: list[str]) -> None:
        with self._lock:
            for row_id in ids:
                self._pinned[row_id] -= 1
                if not self._pinned[row_id]:
                    del self._pinned[row_id]


def _gather(sources: tuple[tuple[int, KVState], ...], start: int, stop: int) -> KVState:
    """Tokens [start, stop) of the concatenated sources, as one fresh state on the CPU."""
    pieces = []
    for piece_start, span in sources:
        lo, hi = max(start, piece_start), min(stop, piece_start + seq_len(span))
        if lo < hi:
            pieces.append(slice_state(span, lo - piece_start, hi - piece_start))
    return tuple(tuple(torch.cat([p[layer][i].cpu() for p in pieces], dim=-2) for i in range(len(pieces[0][layer])))
                 for layer in range(len(pieces[0])))

