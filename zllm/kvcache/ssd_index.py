"""The SSD tier's index: one sqlite row per snapshot, pointing at one immutable blob generation that holds
the whole sequence (snapshot_store.py):

    snapshots(id TEXT PRIMARY KEY, namespace, model, parent, parent_len, tokens BLOB (int32 LE, the full
              sequence), generation (→ blobs/<generation>.zkv), bytes (blob file size), round, prompt_len,
              hint_key, created, last_used, hits)
    meta(key TEXT PRIMARY KEY, value TEXT)    e.g. measured restore/recompute rates

The schema's version is sqlite's `user_version` (0: written before it was set, the same schema). An index
that is not a database, or is from a newer zllm, is set aside whole and the tier starts empty (`open_index`);
one that another process holds locked cannot be set aside (it is in use): `IndexLocked`, the tier stays off.

The index is on disk too, so rows are validated on load (`SnapshotRow.__post_init__`), then checked against
their blobs at open and at every read (soundness.py); a row is inserted only after its blob is
durable (blob_commit.py's commit protocol), in one sqlite transaction, so a crash leaves the old index or the new
one.

`parent` / `parent_len` are an older zllm's: it stored a turn's new tokens on its parent's blob. This one writes
NULL / 0, and a row that names a parent is set aside (soundness.py).
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import struct
from dataclasses import dataclass
from pathlib import Path

from zllm.kvcache.set_aside import set_aside

log = logging.getLogger("zllm.kvcache")

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 5.0  # how long to wait out another connection's lock before calling the index locked
MAX_TOKENS = 1 << 21  # a row claiming more tokens than any context window is not ours

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY, namespace TEXT NOT NULL, model TEXT NOT NULL, parent TEXT, parent_len INTEGER NOT NULL,
    tokens BLOB NOT NULL, generation INTEGER NOT NULL UNIQUE, bytes INTEGER NOT NULL, round INTEGER NOT NULL,
    prompt_len INTEGER NOT NULL, hint_key TEXT, created REAL NOT NULL, last_used REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_COLUMNS = "id, namespace, model, parent, parent_len, tokens, generation, bytes, round, prompt_len, hint_key, " \
           "created, last_used, hits"


class SnapshotInvalid(Exception):
    """A snapshot file or index row failed validation (corrupt, truncated, forged or from another layout)."""


def pack_tokens(tokens: tuple[int, ...] | list[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def unpack_tokens(data: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(data) // 4}i", data)


def token_sha256(packed: bytes) -> str:
    return hashlib.sha256(packed).hexdigest()


@dataclass(frozen=True)
class SnapshotRow:
    id: str
    namespace: str
    model: str
    parent: str | None
    parent_len: int  # an older zllm's chains (the module's docstring): 0 here
    tokens: bytes  # the full sequence, int32 LE (bytes: compact, and prefix tests are memcmp)
    generation: int
    nbytes: int  # the blob file's size
    round: int
    prompt_len: int  # how much of the sequence was prompt (the rest was generated)
    hint_key: str | None
    created: float
    last_used: float
    hits: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, bytes) or len(self.tokens) % 4 or not 0 < len(self.tokens) <= 4 * MAX_TOKENS:
            raise ValueError("token blob is not a sane int32 sequence")
        if (self.parent is None) != (self.parent_len == 0) or not 0 <= self.parent_len < self.length:
            raise ValueError(f"parent_len {self.parent_len} is impossible for a {self.length}-token snapshot")
        if self.generation < 0 or self.nbytes <= 0 or self.round < 1 or not 0 <= self.prompt_len <= self.length:
            raise ValueError("bad generation, size or round")

    @property
    def length(self) -> int:
        return len(self.tokens) // 4

    @property
    def own_length(self) -> int:
        return self.length - self.parent_len

    @property
    def blob_name(self) -> str:
        return blob_name(self.generation)


BLOB_SUFFIX = ".zkv"  # one snapshot format (snapshot_frame.py); older formats had their own suffixes


def blob_name(generation: int) -> str:
    return f"{generation:016x}{BLOB_SUFFIX}"


@dataclass(frozen=True)
class MalformedRow:
    """An index row that is not a snapshot row at all: its id, its generation column as stored, and why."""

    id: str
    generation: object
    reason: str


class IndexLocked(Exception):
    """Another process holds the index locked: it is in use, so it is neither read nor set aside."""


class IndexFromAnotherVersion(sqlite3.DatabaseError):
    """The index's schema version is newer than this zllm's."""


def open_index(path: Path, quarantine_dir: Path) -> tuple[SnapshotIndex, str | None]:
    """(the index at `path`, why the one found there was set aside or None). Raises IndexLocked."""
    try:
        index = SnapshotIndex(path)
    except sqlite3.DatabaseError as exc:
        if _is_locked(exc):
            raise IndexLocked(f"{path} is locked by another process ({exc})") from exc
        reason = f"{path.name} is unreadable ({exc})"
    else:
        try:
            index.load()  # a damaged page shows when the rows are read, not at connect
            return index, None
        except sqlite3.DatabaseError as exc:
            index.close()
            if _is_locked(exc):
                raise IndexLocked(f"{path} is locked by another process ({exc})") from exc
            reason = f"{path.name} is unreadable ({exc})"
    log.warning("kv cache: SSD index %s; set aside, starting empty", reason)
    for suffix in ("-wal", "-shm", ""):  # the index's journal goes with it: it would replay into the new one
        set_aside(path.with_name(path.name + suffix), quarantine_dir)
    return SnapshotIndex(path), reason


def _is_locked(exc: sqlite3.DatabaseError) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class SnapshotIndex:
    """Thin sqlite wrapper; callers serialize access (SnapshotStore holds a lock around every call)."""

    def __init__(self, path: Path):
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a committed row survives power loss, like its blob
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise IndexFromAnotherVersion(f"schema version {version}, this zllm reads up to {SCHEMA_VERSION}")
            self._db.executescript(_SCHEMA)
            if version < SCHEMA_VERSION:
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    def load(self) -> tuple[list[SnapshotRow], list[MalformedRow]]:
        """(well-formed rows, rows that are not). Token blobs are size-checked before being read. Whether a
        well-formed row agrees with its blob is soundness.py's to say."""
        rows, bad = [], []
        for row_id, generation, kind, size in self._db.execute(
                "SELECT id, generation, typeof(tokens), length(tokens) FROM snapshots "
                "WHERE typeof(tokens) != 'blob' OR length(tokens) > ?", (4 * MAX_TOKENS,)):
            what = f"a {size}-byte token blob, over {MAX_TOKENS} tokens" if kind == "blob" else f"tokens are {kind}"
            bad.append(MalformedRow(row_id, generation, what))
        query = f"SELECT {_COLUMNS} FROM snapshots WHERE typeof(tokens) = 'blob' AND length(tokens) <= ?"
        for values in self._db.execute(query, (4 * MAX_TOKENS,)):
            try:
                rows.append(SnapshotRow(*values))
            except (TypeError, ValueError) as exc:
                bad.append(MalformedRow(values[0], values[6], f"malformed row: {exc}"))
        return rows, bad

    def insert(self, row: SnapshotRow, replacing: list[str] = ()) -> None:
        """Insert `row` and delete the rows `replacing` names, in one transaction."""
        placeholders = ", ".join("?" * 14)
        with self._transaction():
            self._db.executemany("DELETE FROM snapshots WHERE id = ?", [(i,) for i in replacing])
            self._db.execute(f"INSERT OR REPLACE INTO snapshots ({_COLUMNS}) VALUES ({placeholders})", (
                row.id, row.namespace, row.model, row.parent, row.parent_len, row.tokens, row.generation, row.nbytes,
                row.round, row.prompt_len, row.hint_key, row.created, row.last_used, row.hits))

    def delete(self, ids: list[str]) -> None:
        with self._transaction():
            self._db.executemany("DELETE FROM snapshots WHERE id = ?", [(i,) for i in ids])

    def touch(self, updates: list[tuple[float, int, str]]) -> None:
        """(last_used, hits, id) per row."""
        with self._transaction():
            self._db.executemany("UPDATE snapshots SET last_used = ?, hits = ? WHERE id = ?", updates)

    def max_generation(self) -> int:
        (value,) = self._db.execute("SELECT coalesce(max(generation), -1) FROM snapshots").fetchone()
        return int(value)

    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._transaction():
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _transaction(self):
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, *_: object) -> None:
        if exc_type is not None:
            self._db.execute("ROLLBACK")
            return
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error:
            # a COMMIT that fails (disk full, I/O error) may leave the transaction open: roll it back, so the
            # row is surely not in the index (its blob is removed next) and the next BEGIN works
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
