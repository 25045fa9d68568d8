"""The SSD tier for engines that hold their own KV (llama.cpp): one opaque state blob per snapshot.

    <cache_dir>/kv-<backend>/index.sqlite + blobs/<gen>.seqstate + quarantine/ (see set_aside.py)

A blob is a backend's exported sequence state (`llama_state_seq_get_data`), framed so that a read can trust
nothing it did not check:

    b"ZLLMSEQ1" | u32 header length | header JSON {layout, tokens, token_sha256, state_bytes, xxh3_128} | state

Commit protocol, as the tensor tier's (ssd_tier.py, blob_commit.py): write blobs/<gen>.tmp and fsync it, rename,
fsync the directory, then insert the index row in one sqlite transaction; a crash at any instant leaves the old
state or the new one, and a step that fails removes what was written. Deletion runs the other way round: row
first, then the file.

Rows are trusted only while they agree with their blobs (soundness.py: size, generation, token count, no
parent), at open and at every read. Reads then verify the frame, the layout, the token hash against the index
row and an XXH3-128 checksum over the state bytes before a byte reaches the engine: a blob that fails is
quarantined and the lookup is a miss.
XXH3 (xxhash), not a cryptographic hash: the check must cost little next to reading the blob, and BLAKE2b
cost more than the read itself. It guards against damage, not against someone who can write the cache
directory (they could as well write the index). The blob is read once, into one buffer the engine loads from.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import struct
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import xxhash

from zllm.cache_views import SsdStats
from zllm.kvcache.blob_commit import commit_blob
from zllm.kvcache.retention import next_eviction
from zllm.kvcache.row_index import RowTable
from zllm.kvcache.set_aside import set_aside
from zllm.kvcache.soundness import RowCheck, recover
from zllm.kvcache.ssd_index import SnapshotInvalid, SnapshotRow, open_index, pack_tokens, token_sha256
from zllm.token_prefix import common_prefix_length
from zllm.private_files import private_dir

log = logging.getLogger("zllm.kvcache")

MAGIC = b"ZLLMSEQ1"
BLOB_SUFFIX = ".seqstate"
MAX_HEADER = 1 << 16


@dataclass(frozen=True)
class SequenceJob:
    """A kept sequence's exported state, handed to the writer thread."""

    id: str
    namespace: str
    model: str
    tokens: tuple[int, ...]
    prompt_length: int
    round: int
    state: bytes | memoryview  # the engine's export (a view over its buffer: no copy)
    hint_key: str | None = None


@dataclass(frozen=True)
class SequenceMatch:
    row: SnapshotRow
    length: int  # tokens shared with the request (a prefix of the snapshot; the engine crops the rest)
    hinted: bool = False


def blob_file(generation: int) -> str:
    return f"{generation:016x}{BLOB_SUFFIX}"


def checksum(data) -> str:
    """Of any bytes-like object (a memoryview over the read buffer: no copy)."""
    return xxhash.xxh3_128_hexdigest(data)


class SequenceSnapshots:
    def __init__(self, directory: Path, layout: str, budget_bytes: int):
        self.directory = Path(directory)
        self.layout = layout
        self.budget_bytes = budget_bytes
        self.blobs, self.quarantine_dir = self.directory / "blobs", self.directory / "quarantine"
        for d in (self.directory, self.blobs, self.quarantine_dir):
            private_dir(d)  # snapshots decode back to prompts: this user's only
        # garbage or from a newer zllm: set aside, start empty; locked by another process: IndexLocked
        self.index, index_set_aside = open_index(self.directory / "index.sqlite", self.quarantine_dir)
        self.index_set_aside = int(index_set_aside is not None)
        self._lock = threading.Lock()
        self.rows: RowTable = RowTable()
        self.quarantined = 0
        self._touches: dict[str, SnapshotRow] = {}
        self._generation = self._recover()

    # ------------------------------------------------------------------ startup

    def _recover(self) -> int:
        """Trust only rows that agree with their blobs (soundness.py: the same check runs at every read); blob
        contents are checked when read. Returns the next generation."""
        self.check = RowCheck(self.blobs, BLOB_SUFFIX, chains=False)  # a blob is a whole sequence's state
        found = recover(self.index, self.check, self.quarantine_dir)
        self.rows = RowTable(found.rows)  # indexed for the longest-prefix lookup
        self.quarantined += found.quarantined
        self.strays = found.strays
        if self.quarantined or self.index_set_aside or self.strays:
            log.warning("kv cache: SSD tier opened with %d snapshots, %d set aside as damaged%s%s", len(self.rows),
                        self.quarantined, f", {self.strays} stray files set aside" if self.strays else "",
                        ", the index set aside" if self.index_set_aside else "")
        return found.next_generation

    # ------------------------------------------------------------------ lookups and reads (engine thread)

    def lookup(self, namespace: str, tokens: tuple[int, ...], hint: str | None = None) -> SequenceMatch | None:
        """The snapshot sharing the longest prefix with `tokens` (a hinted one first, when it is a prefix)."""
        packed = pack_tokens(tokens)
        best: SequenceMatch | None = None
        with self._lock:
            rows = self.rows.candidates(namespace, packed)  # only rows that can share a useful prefix
        for row in rows:
            shared = common_prefix_length(row.tokens, packed) // 4
            hinted = hint is not None and hint in (row.id, row.hint_key) and shared == row.length
            if shared and (best is None or hinted or (shared > best.length and not best.hinted)):
                best = SequenceMatch(row, shared, hinted)
        return best

    def diverging(self, namespace: str, tokens: tuple[int, ...]) -> SequenceMatch | None:
        """The snapshot the request shares the largest fraction of and then leaves (for the near-miss log)."""
        packed = pack_tokens(tokens)
        with self._lock:
            rows = self.rows.candidates(namespace, packed)
        best: SequenceMatch | None = None
        for row in rows:
            shared = common_prefix_length(row.tokens, packed) // 4
            if 0 < shared < row.length and (best is None or shared / row.length > best.length / best.row.length):
                best = SequenceMatch(row, shared)
        return best

    def read(self, row: SnapshotRow) -> memoryview:
        """The state bytes of `row`, verified; SnapshotInvalid (and the blob quarantined) when anything is off."""
        path = self.blobs / blob_file(row.generation)
        try:
            with self._lock:  # the row is trusted only while it still agrees with its blob, as at open
                reason = self.check(row, self.rows)
            if reason is not None:
                raise SnapshotInvalid(f"{path.name}: {reason}")
            state = _read_frame(path, self.layout, row)
        except SnapshotInvalid:
            self.quarantine(row)
            raise
        self._touch(row)
        return state

    def quarantine(self, row: SnapshotRow) -> None:
        with self._lock:
            self.rows.pop(row.id, None)
            self._touches.pop(row.id, None)
            self.quarantined += 1
        try:
            self.index.delete([row.id])
        except sqlite3.Error as exc:  # locked by another process, say: out of service in memory regardless
            log.warning("kv cache: cannot drop quarantined row %s from the index (%s)", row.id, exc)
        self._set_aside(self.blobs / blob_file(row.generation))

    # ------------------------------------------------------------------ writes (writer thread)

    def commit(self, job: SequenceJob) -> SnapshotRow | None:
        """Write `job` durably (blob_commit.py): its row is built, and so checked, before a byte is written, and
        a write that fails removes what it wrote."""
        packed = pack_tokens(job.tokens)
        header = json.dumps({"layout": self.layout, "tokens": len(job.tokens), "token_sha256": token_sha256(packed),
                             "state_bytes": len(job.state), "xxh3_128": checksum(job.state)}).encode()
        frame = MAGIC + struct.pack("<I", len(header)) + header
        with self._lock:
            if job.id in self.rows:  # written already: a second blob under the id would orphan the first
                return None
            generation, self._generation = self._generation, self._generation + 1
        now = time.time()
        row = SnapshotRow(job.id, job.namespace, job.model, None, 0, packed, generation, len(frame) + len(job.state),
                          job.round, job.prompt_length, job.hint_key, now, now)
        final = self.blobs / blob_file(generation)
        committed = commit_blob(final.with_suffix(".tmp"), final, partial(_write_blob, frame=frame, state=job.state),
                                lambda size: self._index(replace(row, nbytes=size)))
        self._enforce_budget()
        return committed

    def _index(self, row: SnapshotRow) -> SnapshotRow:
        self.index.insert(row)
        with self._lock:
            self.rows[row.id] = row
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

    def stats(self) -> SsdStats:
        with self._lock:
            return SsdStats(snapshots=len(self.rows), bytes=sum(r.nbytes for r in self.rows.values()),
                            budget_bytes=self.budget_bytes, quarantined=self.quarantined,
                            index_set_aside=self.index_set_aside, strays=self.strays)

    def prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None,
              namespace: str | None = None) -> list[str]:
        now, doomed = time.time(), []
        for row in self.snapshots():
            if (namespace is None or row.namespace == namespace) and \
                    (older_than_s is None or now - row.last_used > older_than_s):
                if older_than_s is not None or (namespace is not None and max_bytes is None):
                    doomed.append(row)
        if max_bytes is not None:
            left = [r for r in self.snapshots() if r not in doomed]
            total = sum(r.nbytes for r in left)
            for row in reversed(left):  # least recently used first
                if total <= max_bytes:
                    break
                doomed.append(row)
                total -= row.nbytes
        self._delete(doomed)
        return [row.id for row in doomed]

    def close(self) -> None:
        self.flush_touches()
        self.index.close()

    # ------------------------------------------------------------------ internals

    def _touch(self, row: SnapshotRow) -> None:
        with self._lock:
            touched = replace(self.rows.get(row.id, row), last_used=time.time(), hits=row.hits + 1)
            if row.id in self.rows:
                self.rows[row.id] = touched
            self._touches[row.id] = touched

    def _enforce_budget(self) -> None:
        """Delete snapshots until the total fits: least recently used first, each namespace's main conversation
        last (retention.py)."""
        rows, now = self.snapshots(), time.time()
        total = sum(r.nbytes for r in rows)
        doomed = []
        while total > self.budget_bytes and rows:
            victim = next_eviction(rows, rows, now).victim
            rows = [r for r in rows if r is not victim]
            doomed.append(victim)
            total -= victim.nbytes
        self._delete(doomed)

    def _delete(self, rows: list[SnapshotRow]) -> None:
        if not rows:
            return
        self.index.delete([row.id for row in rows])  # the row first: a crash leaves an orphan file, not a dangling row
        with self._lock:
            for row in rows:
                self.rows.pop(row.id, None)
        for row in rows:
            (self.blobs / blob_file(row.generation)).unlink(missing_ok=True)

    def _set_aside(self, path: Path) -> None:
        if set_aside(path, self.quarantine_dir):
            log.warning("kv cache: set aside %s", path.name)


def _read_frame(path: Path, layout: str, row: SnapshotRow) -> memoryview:
    """The verified state bytes: a view into the one buffer the file was read into (writable, so the engine
    can load from it without another copy)."""
    try:
        if not path.is_file():
            raise SnapshotInvalid(f"{path.name} is not a file")
        with open(path, "rb") as f:
            data = memoryview(bytearray(os.fstat(f.fileno()).st_size))
            if f.readinto(data) != len(data):
                raise SnapshotInvalid(f"{path.name} changed while it was read")
    except OSError as exc:
        raise SnapshotInvalid(f"{path.name}: {exc}") from exc
    if len(data) < 12 or bytes(data[:8]) != MAGIC:
        raise SnapshotInvalid(f"{path.name}: not a sequence snapshot")
    (header_len,) = struct.unpack_from("<I", data, 8)
    if header_len > MAX_HEADER or 12 + header_len > len(data):
        raise SnapshotInvalid(f"{path.name}: header length {header_len} is impossible")
    try:
        header = json.loads(bytes(data[12:12 + header_len]))
        expected = {"layout": layout, "tokens": row.length, "token_sha256": token_sha256(row.tokens)}
        if any(header.get(k) != v for k, v in expected.items()):
            raise SnapshotInvalid(f"{path.name}: written for another model, layout or token sequence")
        state = data[12 + header_len:]
        if header.get("state_bytes") != len(state) or header.get("xxh3_128") != checksum(state):
            raise SnapshotInvalid(f"{path.name}: state bytes fail their checksum (truncated or damaged)")
    except (ValueError, AttributeError) as exc:
        raise SnapshotInvalid(f"{path.name}: unreadable header") from exc
    return state


def _write_blob(path: Path, *, frame: bytes, state: bytes | memoryview) -> int:
    """The framed state at `path`, fsynced; returns the file size."""
    with open(path, "wb") as f:
        f.write(frame)
        f.write(state)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()
