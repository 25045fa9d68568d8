"""The one SSD tier: snapshots that survive restarts, for every backend, in one format (snapshot_frame.py).

    <ssd_dir>/index.sqlite + blobs/<generation>.zkv + quarantine/ (see set_aside.py)

A snapshot is one finished sequence: the bytes its backend's KV exported (kvcache/kv_interface.py `export`),
framed and chunk-checksummed. Whole, not chained: a turn's snapshot holds the whole conversation so far, so a
restore opens one file.

Supersession: a snapshot whose tokens are a strict prefix of a newer one of the same namespace (the conversation's
earlier turns) is deleted when the newer one commits, in the same index transaction; each turn would otherwise keep
a full copy of everything before it. Nothing is lost to a lookup: whatever a request shares with the older one it
shares with the newer one, at least as many tokens (an edited earlier message forks from the newer one just as
well). A token-major read costs the same from either; a whole payload (llama.cpp) costs the newer blob's size,
which the restore-vs-recompute estimate weighs. A blob being read is unlinked once its read ends, and a read that
finds its snapshot superseded before it began reads the newer one. The open-time sweep supersedes too (a crash
between a deferred unlink and its row, or a tier written before this rule).

Commit protocol (blob_commit.py): write blobs/<gen>.tmp and fsync it, rename, fsync the directory, then insert the
index row in one sqlite transaction; a crash at any instant leaves the old state or the new one, and a step that
fails removes what was written. Deletion runs the other way round: row first, then the file.

Rows are trusted only while they agree with their blobs (soundness.py: size, generation, token count, no parent),
at open and at every read; a read then checks the frame and the chunks it reads (snapshot_frame.py). A blob that
fails is quarantined and the lookup is a miss. An older zllm's tier in the same directory (torch's
`.safetensors` blobs, llama.cpp's `.seqstate` ones) is set aside at open: its rows name blobs this tier never
writes (quarantined, logged), its files are strays (set aside, counted).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from zllm.cache_views import SsdStats
from zllm.kvcache import snapshot_frame
from zllm.kvcache.blob_commit import commit_blob
from zllm.kvcache.retention import next_eviction
from zllm.kvcache.row_index import RowTable
from zllm.kvcache.set_aside import set_aside
from zllm.kvcache.soundness import RowCheck, recover
from zllm.kvcache.ssd_index import (
    BLOB_SUFFIX,
    SnapshotInvalid,
    SnapshotRow,
    blob_name,
    open_index,
    pack_tokens,
    token_sha256,
)
from zllm.private_files import private_dir
from zllm.token_prefix import common_prefix_length

log = logging.getLogger("zllm.kvcache")

@dataclass(frozen=True)
class SnapshotJob:
    """A finished sequence for the writer thread. `export` runs there and returns the payload (a bytes-like):
    the engine thread hands over only what it no longer mutates."""

    id: str
    namespace: str
    model: str
    tokens: tuple[int, ...]
    prompt_length: int
    round: int
    export: Callable[[], object]
    hint_key: str | None = None


@dataclass(frozen=True)
class SnapshotMatch:
    row: SnapshotRow
    length: int  # tokens shared with the request: a prefix of the snapshot's
    hinted: bool = False


class SnapshotRead(NamedTuple):
    payload: memoryview
    first: int  # the first token the payload holds
    stored: int  # tokens in the snapshot it was read from (a newer one than the match's when that was superseded)


def supersedes(newer: SnapshotRow, older: SnapshotRow) -> bool:
    """Whether `older` is an earlier turn of `newer`'s conversation: everything it holds, `newer` holds too."""
    return (older.namespace, older.model) == (newer.namespace, newer.model) and older.length < newer.length \
        and newer.tokens.startswith(older.tokens)


blob_file = blob_name


class SnapshotStore:
    def __init__(self, directory: Path, layout: str, budget_bytes: int, *, token_bytes: int = 0,
                 crash_hook: Callable[[str], None] | None = None):
        """`layout`: what makes a payload loadable (a blob written for another is set aside); `token_bytes`: the
        payload's bytes per token when it is token-major (a range can be read), 0 when it is read whole."""
        self.directory = Path(directory)
        self.layout, self.token_bytes, self.budget_bytes = layout, token_bytes, budget_bytes
        self.blobs, self.quarantine_dir = self.directory / "blobs", self.directory / "quarantine"
        for d in (self.directory, self.blobs, self.quarantine_dir):
            private_dir(d)  # snapshots decode back to prompts: this user's only
        self._crash_hook = crash_hook or (lambda stage: None)
        # garbage or from a newer zllm: set aside, start empty; locked by another process: IndexLocked
        self.index, index_set_aside = open_index(self.directory / "index.sqlite", self.quarantine_dir)
        self._lock = threading.Lock()
        self._touches: dict[str, SnapshotRow] = {}
        self._reading: Counter[int] = Counter()  # generations a read has open: their unlink waits for it
        self._unlink_after_read: set[int] = set()
        self.counters = {"writes": 0, "writes_skipped": 0, "restores": 0, "quarantined": 0, "evicted": 0,
                         "superseded": 0, "index_set_aside": int(index_set_aside is not None), "strays": 0}
        self._generation = self._recover()

    def _recover(self) -> int:
        """Trust only rows that agree with their blobs (the same check runs at every read). Returns the next
        generation."""
        self.check = RowCheck(self.blobs, BLOB_SUFFIX, bytes_per_token=self.token_bytes)
        found = recover(self.index, self.check, self.quarantine_dir)
        self.rows = RowTable(found.rows)  # indexed for the longest-prefix lookup
        self.counters["quarantined"] += found.quarantined
        self.counters["strays"] = found.strays
        if found.quarantined or self.counters["index_set_aside"] or found.strays:
            log.warning("kv cache: SSD tier opened with %d snapshots, %d set aside as damaged or of an older "
                        "format%s%s", len(self.rows), found.quarantined,
                        f", {found.strays} stray files set aside" if found.strays else "",
                        ", the index set aside" if self.counters["index_set_aside"] else "")
        superseded = [row for row in self.rows.values() if self._superseding(row) is not None]
        if superseded:  # a crash before a deferred unlink, or a tier written before supersession
            self._delete(superseded)
            self.counters["superseded"] += len(superseded)
            log.info("kv cache: deleted %d SSD snapshots a newer one holds", len(superseded))
        return found.next_generation

    # ------------------------------------------------------------------ lookups and reads

    def lookup(self, namespace: str, tokens: tuple[int, ...], hint: str | None = None
               ) -> tuple[SnapshotMatch | None, SnapshotMatch | None]:
        """(the snapshot sharing the longest prefix with `tokens`, a hinted one first when it is a prefix; the
        one the request shares the largest fraction of and then leaves, for the near-miss log)."""
        packed = pack_tokens(tokens)
        with self._lock:
            rows = self.rows.candidates(namespace, packed)  # only rows that can share a useful prefix
        best = diverged = None
        for row in rows:
            shared = common_prefix_length(row.tokens, packed) // 4
            hinted = hint is not None and hint in (row.id, row.hint_key) and shared == row.length
            if shared and (best is None or hinted or (shared > best.length and not best.hinted)):
                best = SnapshotMatch(row, shared, hinted)
            if 0 < shared < row.length and (diverged is None
                                            or shared / row.length > diverged.length / diverged.row.length):
                diverged = SnapshotMatch(row, shared)
        return best, diverged

    def read_bytes(self, match: SnapshotMatch, skip: int) -> int:
        """Bytes a read of `match` costs when its first `skip` tokens are there already."""
        return (match.length - skip) * self.token_bytes if self.token_bytes else match.row.nbytes

    def read(self, match: SnapshotMatch, skip: int) -> SnapshotRead:
        """Tokens [skip, match.length) of a token-major payload, the whole payload otherwise; verified.
        SnapshotInvalid (the blob quarantined) when anything is off."""
        first = skip if self.token_bytes else 0
        with self._lock:  # the row is trusted only while it still agrees with its blob, as at open
            row = self._readable(match)
            self._reading[row.generation] += 1
            reason = self.check(row)
        path = self.blobs / blob_file(row.generation)
        try:
            if reason is not None:
                raise SnapshotInvalid(f"{path.name}: {reason}")
            payload = snapshot_frame.read_payload(
                path, layout=self.layout, tokens=row.length, token_sha256=token_sha256(row.tokens),
                token_bytes=self.token_bytes, first=first * self.token_bytes,
                stop=match.length * self.token_bytes if self.token_bytes else None)
        except SnapshotInvalid as exc:
            self.quarantine(row, str(exc))
            raise
        finally:
            self._read_done(row.generation)
        self._touch(row)
        return SnapshotRead(payload, first, row.length)

    def _readable(self, match: SnapshotMatch) -> SnapshotRow:
        """The match's row, or, when a newer snapshot superseded it since the lookup, that one: it holds the same
        prefix (caller holds the lock)."""
        row = match.row
        if row.id in self.rows:
            return self.rows[row.id]
        prefix = row.tokens[:4 * match.length]
        return next((r for r in self.rows.candidates(row.namespace, prefix)
                     if r.model == row.model and r.tokens.startswith(prefix)), row)

    def _read_done(self, generation: int) -> None:
        with self._lock:
            self._reading[generation] -= 1
            if self._reading[generation]:
                return
            del self._reading[generation]
            if generation not in self._unlink_after_read:
                return
            self._unlink_after_read.discard(generation)
        (self.blobs / blob_file(generation)).unlink(missing_ok=True)

    def quarantine(self, row: SnapshotRow, reason: str = "") -> None:
        """Out of service (an engine refusing a payload calls this too); the blob kept for inspection."""
        with self._lock:
            if self.rows.pop(row.id, None) is None:
                return
            self._touches.pop(row.id, None)
            self.counters["quarantined"] += 1
        log.warning("kv cache: quarantined snapshot %s (%s)", row.id, reason)
        try:
            self.index.delete([row.id])
        except sqlite3.Error as exc:  # locked by another process, say: out of service in memory regardless
            log.warning("kv cache: cannot drop quarantined row %s from the index (%s)", row.id, exc)
        if set_aside(self.blobs / blob_file(row.generation), self.quarantine_dir):
            log.warning("kv cache: set aside %s", blob_file(row.generation))

    # ------------------------------------------------------------------ writes (writer thread)

    def commit(self, job: SnapshotJob) -> SnapshotRow | None:
        """Write `job` durably: its row is built, and so checked, before a byte is written, and a write that
        fails removes what it wrote. Skipped when a snapshot already holds its tokens."""
        packed = pack_tokens(job.tokens)
        with self._lock:
            covered = any(r.tokens.startswith(packed) for r in self.rows.candidates(job.namespace, packed))
            if job.id in self.rows or covered:
                self.counters["writes_skipped"] += 1
                return None
            generation, self._generation = self._generation, self._generation + 1
        now = time.time()
        row = SnapshotRow(job.id, job.namespace, job.model, None, 0, packed, generation, 1, job.round,
                          job.prompt_length, job.hint_key, now, now)
        payload = job.export()
        head = snapshot_frame.frame(layout=self.layout, tokens=len(job.tokens), token_sha256=token_sha256(packed),
                                    token_bytes=self.token_bytes, payload=payload)
        final = self.blobs / blob_file(generation)
        committed = commit_blob(final.with_suffix(".tmp"), final, lambda temp: _write(temp, head, payload),
                                lambda size: self._index(replace(row, nbytes=size)), self._crash_hook)
        self.evict_to_budget()
        return committed

    def _index(self, row: SnapshotRow) -> SnapshotRow:
        """Insert `row` and delete the snapshots it supersedes in one transaction: a crash leaves the older rows
        or the newer one, never neither; the older blobs go after (a crash leaves orphans the next open removes)."""
        with self._lock:
            superseded = [r for r in self.rows.candidates(row.namespace, row.tokens) if supersedes(row, r)]
        self.index.insert(row, replacing=[r.id for r in superseded])
        self._crash_hook("indexed")
        with self._lock:
            self.rows[row.id] = row
            self.counters["writes"] += 1
            self.counters["superseded"] += len(superseded)
            self._forget(superseded)
        if superseded:
            self._crash_hook("superseded-rows")  # out of the index, their blobs still on disk
        self._unlink(superseded)
        return row

    def flush_touches(self) -> None:
        with self._lock:
            touches, self._touches = self._touches, {}
        if touches:
            try:
                self.index.touch([(row.last_used, row.hits, row.id) for row in touches.values()])
            except sqlite3.Error as exc:  # recency only: losing it must not fail a shutdown
                log.warning("kv cache: cannot record snapshot use in the index (%s)", exc)

    # ------------------------------------------------------------------ maintenance (any thread)

    def snapshots(self) -> list[SnapshotRow]:
        with self._lock:
            return sorted(self.rows.values(), key=lambda r: r.last_used, reverse=True)

    @property
    def total_bytes(self) -> int:
        return sum(r.nbytes for r in self.rows.values())

    def stats(self) -> SsdStats:
        with self._lock:
            return SsdStats(snapshots=len(self.rows), bytes=self.total_bytes, budget_bytes=self.budget_bytes,
                            **self.counters)

    def evict_to_budget(self, budget: int | None = None) -> list[str]:
        """Delete snapshots until the total fits: least recently used first, each namespace's main conversation
        last (retention.py); returns their ids."""
        budget = self.budget_bytes if budget is None else budget
        rows, now = self.snapshots(), time.time()
        total, doomed = sum(r.nbytes for r in rows), []
        while total > budget and rows:
            victim = next_eviction(rows, rows, now).victim
            if victim is None:
                break
            rows = [r for r in rows if r is not victim]
            doomed.append(victim)
            total -= victim.nbytes
        self._delete(doomed)
        self.counters["evicted"] += len(doomed)
        return [r.id for r in doomed]

    def prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None,
              namespace: str | None = None) -> list[str]:
        """Delete snapshots not used for `older_than_s` and/or of `namespace`, then least recently used ones
        until the total is at most `max_bytes`."""
        removed = []
        if older_than_s is not None or namespace is not None:
            cutoff = time.time() - older_than_s if older_than_s is not None else None
            doomed = [r for r in self.snapshots() if (namespace is None or r.namespace == namespace)
                      and (cutoff is None or r.last_used <= cutoff)]
            self._delete(doomed)
            removed = [r.id for r in doomed]
        if max_bytes is not None:
            removed += self.evict_to_budget(max_bytes)
        return removed

    def close(self) -> None:
        self.flush_touches()
        self.index.close()

    def check_integrity(self) -> None:
        """Index ⇔ disk: rows load back identical, every row is sound and its frame validates, no temporary or
        orphan files, and the bytes add up."""
        with self._lock:
            rows, malformed = self.index.load()
            assert not malformed, f"malformed rows {malformed}"
            assert {r.id: r.generation for r in rows} == {r.id: r.generation for r in self.rows.values()}
            for row in self.rows.values():
                assert (reason := self.check(row)) is None, f"{row.id}: {reason}"
                try:
                    snapshot_frame.validate(self.blobs / blob_file(row.generation), layout=self.layout,
                                            tokens=row.length, token_sha256=token_sha256(row.tokens),
                                            token_bytes=self.token_bytes)
                except SnapshotInvalid as exc:
                    raise AssertionError(f"{row.id}: {exc}") from exc
            names = sorted(p.name for p in self.blobs.iterdir())
            assert names == sorted(blob_file(r.generation) for r in self.rows.values()), "no temporary or orphans"
            assert self.total_bytes == sum((self.blobs / n).stat().st_size for n in names), "bytes add up"

    # ------------------------------------------------------------------ internals

    def _touch(self, row: SnapshotRow) -> None:
        with self._lock:
            touched = replace(self.rows.get(row.id, row), last_used=time.time(), hits=row.hits + 1)
            if row.id in self.rows:
                self.rows[row.id] = touched
            self._touches[row.id] = touched
            self.counters["restores"] += 1

    def _superseding(self, row: SnapshotRow) -> SnapshotRow | None:
        """A newer snapshot holding all of `row` (caller holds the lock or runs before any other thread)."""
        return next((r for r in self.rows.candidates(row.namespace, row.tokens) if supersedes(r, row)), None)

    def _delete(self, rows: list[SnapshotRow]) -> None:
        if not rows:
            return
        self.index.delete([row.id for row in rows])  # the row first: a crash leaves an orphan file, not a dangling row
        with self._lock:
            self._forget(rows)
        self._unlink(rows)

    def _forget(self, rows: list[SnapshotRow]) -> None:
        """Out of the in-memory index (caller holds the lock)."""
        for row in rows:
            self.rows.pop(row.id, None)
            self._touches.pop(row.id, None)

    def _unlink(self, rows: list[SnapshotRow]) -> None:
        """Delete the blobs of rows already out of the index; one a read has open goes when the read ends."""
        with self._lock:
            busy = {row.generation for row in rows if self._reading[row.generation]}
            self._unlink_after_read |= busy
        for row in rows:
            if row.generation not in busy:
                (self.blobs / blob_file(row.generation)).unlink(missing_ok=True)


def _write(path: Path, head: bytes, payload) -> int:
    """The framed payload at `path`, fsynced; returns the file size."""
    with open(path, "wb") as f:
        f.write(head)
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()
