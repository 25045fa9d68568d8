"""`ResponseStore`: OpenAI Responses kept in sqlite, so `previous_response_id` chains survive a restart.

One row per response. A row holds the whole conversation the response answered plus what it produced, as
canonical messages, so continuing a chain is one lookup (no walk up a parent chain that retention may have
cut). Rows of a long chain repeat their history; the JSON is zlib-compressed and retention bounds the total.

    CREATE TABLE responses (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, namespace TEXT,
                            saved_at REAL, record BLOB)       -- record = zlib(JSON), see `_encode`
    PRAGMA user_version = 1                                   -- the schema version

    store = ResponseStore(state_dir / "responses.sqlite3", max_rows=10_000, max_age_s=30 * 86400, max_bytes=1 << 30)
    store.save(StoredResponse(id="resp_1", namespace="ab12", ...))
    store.load("resp_1", namespace="ab12")     # None for an unknown id *or* another namespace
    store.close()

Thread-safe (one connection behind a lock; the API edge calls it from one executor thread, so there is
one writer). WAL journal: readers in other processes never block the writer. Every call is short: one
indexed statement, plus a retention sweep every `PRUNE_EVERY` saves; the byte bound is kept on every save
(a running total of the stored records' sizes, so a burst of huge inputs cannot outgrow it between sweeps).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from zllm.canonical import Message
from zllm.errors import ZllmError
from zllm.private_files import open_private, private_dir, tighten
from zllm.store.codec import messages_from_json, messages_to_json

SCHEMA_VERSION = 1
PRUNE_EVERY = 64
DEFAULT_MAX_BYTES = 1 << 30
MEMORY = ":memory:"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    namespace TEXT NOT NULL,
    saved_at REAL NOT NULL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_saved_at ON responses(saved_at);
"""


class StoreError(ZllmError):
    """The store file cannot be used (corrupt, or written by a newer zllm)."""

    code = "store_error"


@dataclass(frozen=True)
class StoredResponse:
    id: str
    # the API key's namespace: only the same namespace may read, continue or delete it
    namespace: str
    created_at: float
    # the conversation this response answered (the request's own instructions excluded: they do not carry over)
    input_messages: tuple[Message, ...]
    output_messages: tuple[Message, ...]
    # tools the conversation itself declared (Responses `additional_tools` items), as the client sent them
    input_tools: tuple[dict, ...] = ()
    # the API object as the client received it, for `GET /v1/responses/{id}`
    response: dict = field(default_factory=dict)

    @property
    def conversation(self) -> tuple[Message, ...]:
        """What a follow-up turn continues from: the input, then the output."""
        return self.input_messages + self.output_messages


class ResponseStore:
    def __init__(self, path: Path | str, *, max_rows: int = 10_000, max_age_s: float = 30 * 86400,
                 max_bytes: int = DEFAULT_MAX_BYTES, clock: Callable[[], float] = time.time):
        """`max_rows` / `max_age_s` / `max_bytes` (stored records, compressed) bound what is kept (0 = no
        bound), the oldest going first; `path=":memory:"` keeps nothing on disk."""
        self.path = str(path)
        self.max_rows = max_rows
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._saves = 0
        self._db = _connect(self.path)
        self._bytes = self._stored_bytes()
        self.prune()

    @classmethod
    def in_memory(cls, **options) -> ResponseStore:
        return cls(MEMORY, **options)

    def save(self, record: StoredResponse) -> None:
        """Insert (or replace, same id) `record`; past `max_bytes`, the oldest rows go at once."""
        blob = _encode(record)
        with self._lock:
            replaced = self._db.execute("SELECT length(record) FROM responses WHERE id = ?", (record.id,)).fetchone()
            self._db.execute(
                "INSERT OR REPLACE INTO responses (id, namespace, saved_at, record) VALUES (?, ?, ?, ?)",
                (record.id, record.namespace, self._clock(), blob),
            )
            self._bytes += len(blob) - (replaced[0] if replaced else 0)
            self._saves += 1
            due = self._saves % PRUNE_EVERY == 0
            if self.max_bytes and self._bytes > self.max_bytes:
                self._evict_to(self.max_bytes)
        if due:
            self.prune()

    def load(self, response_id: str, namespace: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT record FROM responses WHERE id = ? AND namespace = ?", (response_id, namespace)
            ).fetchone()
        return None if row is None else _decode(response_id, namespace, row[0])

    def delete(self, response_id: str, namespace: str) -> bool:
        with self._lock:
            cursor = self._db.execute("DELETE FROM responses WHERE id = ? AND namespace = ?",
                                      (response_id, namespace))
            self._bytes = self._stored_bytes()
        return cursor.rowcount > 0

    def prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None) -> int:
        """The retention sweep: rows older than `max_age_s`, then the oldest beyond `max_rows` and `max_bytes`.
        A manual prune tightens it with `older_than_s` and/or `max_bytes` (0 = everything). Returns how many
        rows went."""
        ages = [age for age in (self.max_age_s or None, older_than_s) if age is not None]
        sizes = [size for size in (self.max_bytes or None, max_bytes) if size is not None]
        removed = 0
        with self._lock:
            if ages:
                cutoff = self._clock() - min(ages)
                removed += self._db.execute("DELETE FROM responses WHERE saved_at < ?", (cutoff,)).rowcount
            if self.max_rows:
                removed += self._db.execute(
                    "DELETE FROM responses WHERE seq <= "
                    "(SELECT seq FROM responses ORDER BY seq DESC LIMIT 1 OFFSET ?)", (self.max_rows,)
                ).rowcount
            self._bytes = self._stored_bytes()
            if sizes and self._bytes > min(sizes):
                removed += self._evict_to(min(sizes))
        return removed

    def compact(self) -> None:
        """Give the space of removed rows back to the file system (a manual prune; rewrites the file)."""
        if self.path == MEMORY:
            return
        with self._lock:
            self._db.execute("VACUUM")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def stats(self) -> dict:
        """Rows, stored bytes, the file's size on disk (with its WAL) and the bounds."""
        with self._lock:
            rows, oldest, newest = self._db.execute(
                "SELECT COUNT(*), MIN(saved_at), MAX(saved_at) FROM responses").fetchone()
            stored = self._bytes
        return {"path": self.path, "rows": rows, "bytes": stored, "file_bytes": self._file_bytes(),
                "oldest": oldest, "newest": newest, "max_rows": self.max_rows, "max_bytes": self.max_bytes,
                "max_age_s": self.max_age_s}

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def _stored_bytes(self) -> int:
        return self._db.execute("SELECT COALESCE(SUM(length(record)), 0) FROM responses").fetchone()[0]

    def _evict_to(self, max_bytes: int) -> int:
        """Keep the newest rows that fit in `max_bytes` together; the caller holds the lock."""
        removed = self._db.execute(
            "DELETE FROM responses WHERE seq IN (SELECT seq FROM (SELECT seq, SUM(length(record)) "
            "OVER (ORDER BY seq DESC) AS kept FROM responses) WHERE kept > ?)", (max_bytes,)).rowcount
        self._bytes = self._stored_bytes()
        return removed

    def _file_bytes(self) -> int:
        if self.path == MEMORY:
            return 0
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.stat(self.path + suffix).st_size
        return total

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _connect(path: str) -> sqlite3.Connection:
    hint = f"delete {path} to start with an empty response store (stored chains are lost)"
    try:
        # autocommit: every statement is its own short transaction; the lock serializes them
        if path != MEMORY:
            _create_private(Path(path))
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=5.0)
        if path != MEMORY:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across crashes of the daemon
        _migrate(db, path, hint)
        return db
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot open the response store {path}: {exc}", hint=hint) from None
    except OSError as exc:
        raise StoreError(f"cannot open the response store {path}: {exc.strerror or exc}",
                         hint="check the state directory's owner and permissions") from None


def _create_private(path: Path) -> None:
    """Whole conversations live here: the file (and the -wal/-shm sqlite makes with the file's own mode) is
    0600 in a 0700 directory, whatever the umask; an older, wider file is narrowed."""
    private_dir(path.parent)
    for existing in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        tighten(existing)
    os.close(open_private(path, os.O_RDWR))


def _migrate(db: sqlite3.Connection, path: str, hint: str) -> None:
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(f"the response store {path} has schema v{version}; this zllm reads v{SCHEMA_VERSION}",
                         hint=f"upgrade zllm, or {hint}")
    if version < SCHEMA_VERSION:  # 0 = a new file (no older schema exists yet)
        db.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")


def _encode(record: StoredResponse) -> bytes:
    data = {
        "created_at": record.created_at,
        "input": messages_to_json(record.input_messages),
        "output": messages_to_json(record.output_messages),
        "input_tools": list(record.input_tools),
        "response": record.response,
    }
    return zlib.compress(json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode())


def _decode(response_id: str, namespace: str, blob: bytes) -> StoredResponse:
    data = json.loads(zlib.decompress(blob))
    return StoredResponse(
        id=response_id,
        namespace=namespace,
        created_at=data["created_at"],
        input_messages=messages_from_json(data["input"]),
        output_messages=messages_from_json(data["output"]),
        input_tools=tuple(data["input_tools"]),
        response=data["response"],
    )
