"""Prompt fingerprints of earlier requests, by response id: what cache diagnostics compare a new request with.

Anthropic's `diagnostics.previous_message_id` and OpenAI Responses' `prompt_cache_options.comparison_response_id`
name an earlier response; zllm answers why the new request could not reuse that one's cached prefix. The
fingerprint keeps what the answer needs and nothing a person wrote: digests of the model, the system prompt,
each tool and each message, and of the other settings that change the prompt (thinking, tool choice,
response format), plus the prompt's token ids, so the divergence is found at the token where the cache
itself stops matching. The diagnosis made for a request is kept with its row (`zllm cache explain-miss --id`).

    CREATE TABLE fingerprints (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, namespace TEXT,
                               saved_at REAL, record BLOB)      -- record = zlib(JSON); token ids as uint32
    store = FingerprintStore(state_dir / "fingerprints.sqlite3", max_rows=256)
    store.save(fingerprint)                      # keyed by fingerprint.response_id within its namespace
    store.load("msg_1", namespace="ab12")        # None for an unknown id *or* another namespace
    store.save_diagnosis("msg_2", "ab12", diagnosis)

Bounded: the newest `max_rows` rows (each holds its prompt's token ids compressed, so even long prompts keep
the file small) and none older than `max_age_s`. On disk in the state dir, so a comparison survives a restart;
`:memory:` keeps nothing on disk. Thread-safe: one connection behind a lock, every call one short statement.
"""

from __future__ import annotations

import array
import json
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from zllm.diagnosis.records import CacheDiagnosis, RequestFingerprint
from zllm.store.responses import MEMORY, StoreError

SCHEMA_VERSION = 1
PRUNE_EVERY = 32

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fingerprints (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    namespace TEXT NOT NULL,
    saved_at REAL NOT NULL,
    record BLOB NOT NULL,
    diagnosis TEXT
);
CREATE INDEX IF NOT EXISTS fingerprints_saved_at ON fingerprints(saved_at);
"""


class FingerprintStore:
    def __init__(self, path: Path | str, *, max_rows: int = 256, max_age_s: float = 7 * 86400,
                 clock: Callable[[], float] = time.time):
        self.path = str(path)
        self.max_rows = max_rows
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._saves = 0
        self._db = _connect(self.path)
        self.prune()

    @classmethod
    def in_memory(cls, **options) -> FingerprintStore:
        return cls(MEMORY, **options)

    def save(self, fingerprint: RequestFingerprint) -> None:
        assert fingerprint.response_id, "a fingerprint is kept under the response id the client received"
        blob = _encode(fingerprint)
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO fingerprints (id, namespace, saved_at, record) VALUES (?, ?, ?, ?)",
                (fingerprint.response_id, fingerprint.namespace, self._clock(), blob))
            self._saves += 1
            due = self._saves % PRUNE_EVERY == 0
        if due:
            self.prune()

    def load(self, response_id: str, namespace: str) -> RequestFingerprint | None:
        with self._lock:
            row = self._db.execute("SELECT record FROM fingerprints WHERE id = ? AND namespace = ?",
                                   (response_id, namespace)).fetchone()
        return None if row is None else _decode(response_id, namespace, row[0])

    def save_diagnosis(self, response_id: str, namespace: str, diagnosis: CacheDiagnosis) -> None:
        """Attach the diagnosis made for `response_id` (its row must be saved first)."""
        text = json.dumps(diagnosis.to_json(), ensure_ascii=False)
        with self._lock:
            self._db.execute("UPDATE fingerprints SET diagnosis = ? WHERE id = ? AND namespace = ?",
                             (text, response_id, namespace))

    def diagnosis(self, response_id: str) -> tuple[str, CacheDiagnosis] | None:
        """(namespace, diagnosis) made for `response_id`, in any namespace: for `zllm cache explain-miss --id`
        on the control socket, which only the daemon's owner can reach."""
        with self._lock:
            row = self._db.execute("SELECT namespace, diagnosis FROM fingerprints WHERE id = ?",
                                   (response_id,)).fetchone()
        if row is None or row[1] is None:
            return None
        return row[0], CacheDiagnosis.from_json(json.loads(row[1]))

    def prune(self) -> int:
        removed = 0
        with self._lock:
            if self.max_age_s:
                cutoff = self._clock() - self.max_age_s
                removed += self._db.execute("DELETE FROM fingerprints WHERE saved_at < ?", (cutoff,)).rowcount
            if self.max_rows:
                removed += self._db.execute(
                    "DELETE FROM fingerprints WHERE seq <= "
                    "(SELECT seq FROM fingerprints ORDER BY seq DESC LIMIT 1 OFFSET ?)", (self.max_rows,)
                ).rowcount
        return removed

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM fingerprints").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _connect(path: str) -> sqlite3.Connection:
    hint = f"delete {path}: only cache diagnostics of earlier requests are lost"
    try:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=5.0)
        if path != MEMORY:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"the fingerprint store {path} has schema v{version}; this zllm reads "
                             f"v{SCHEMA_VERSION}", hint=f"upgrade zllm, or {hint}")
        if version < SCHEMA_VERSION:
            db.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")
        return db
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot open the fingerprint store {path}: {exc}", hint=hint) from None


def _encode(fp: RequestFingerprint) -> bytes:
    data = {"model": fp.model, "system": fp.system, "tools": [list(t) for t in fp.tools],
            "messages": list(fp.messages), "roles": list(fp.roles), "options": fp.options,
            "busters": list(fp.busters)}
    header = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    ids = array.array("I", fp.prompt_ids).tobytes()
    return zlib.compress(len(header).to_bytes(4, "little") + header + ids, 1)


def _decode(response_id: str, namespace: str, blob: bytes) -> RequestFingerprint:
    raw = zlib.decompress(blob)
    size = int.from_bytes(raw[:4], "little")
    data = json.loads(raw[4:4 + size])
    ids = array.array("I")
    ids.frombytes(raw[4 + size:])
    return RequestFingerprint(
        model=data["model"], system=data["system"], tools=tuple(tuple(t) for t in data["tools"]),
        messages=tuple(data["messages"]), roles=tuple(data["roles"]), options=dict(data["options"]),
        prompt_ids=tuple(ids), busters=tuple(data["busters"]), response_id=response_id, namespace=namespace)
