"""`ResponseStore`: sqlite persistence of Responses chains (round trip, restart, retention, schema, threads)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from zllm.canonical import Message, ToolCall
from zllm.store import ResponseStore, StoredResponse, StoreError
from zllm.store.codec import message_from_json, message_to_json
from zllm.store.responses import SCHEMA_VERSION

CONVERSATION = (
    Message("system", "Be brief."),
    Message("user", "ls?"),
    Message("assistant", "", tool_calls=(ToolCall("call_1", "ns.sh", '{"cmd": "ls"}'),), reasoning="look"),
    Message("tool", "a.txt\nb.txt", tool_call_id="call_1", name="ns.sh"),
)
OUTPUT = (Message("assistant", "Two files: a.txt, b.txt — ünïcode ok"),)


def record(response_id: str = "resp_1", namespace: str = "ns1", **fields) -> StoredResponse:
    defaults = dict(created_at=1_700_000_000.0, input_messages=CONVERSATION, output_messages=OUTPUT,
                    input_tools=({"type": "function", "name": "extra"},),
                    response={"id": response_id, "object": "response", "status": "completed"})
    return StoredResponse(id=response_id, namespace=namespace, **{**defaults, **fields})


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "responses.sqlite3"


def test_message_codec_round_trips_every_field():
    for message in CONVERSATION + OUTPUT + (Message("user", ""),):
        assert message_from_json(message_to_json(message)) == message
    assert message_to_json(Message("user", "hi")) == {"role": "user", "content": "hi"}


def test_save_then_load_round_trips(path):
    store = ResponseStore(path)
    store.save(record())
    loaded = store.load("resp_1", "ns1")
    assert loaded == record()
    assert loaded.conversation == CONVERSATION + OUTPUT
    assert store.load("resp_missing", "ns1") is None
    store.close()


def test_another_namespace_sees_nothing_and_cannot_delete(path):
    store = ResponseStore(path)
    store.save(record())
    assert store.load("resp_1", "other") is None
    assert store.delete("resp_1", "other") is False
    assert store.delete("resp_1", "ns1") is True
    assert store.load("resp_1", "ns1") is None
    store.close()


def test_reopening_the_file_keeps_the_chain(path):
    first = ResponseStore(path)
    first.save(record("resp_a"))
    first.save(record("resp_b", input_messages=record().conversation))
    first.close()
    reopened = ResponseStore(path)
    assert reopened.load("resp_b", "ns1").input_messages == CONVERSATION + OUTPUT
    assert reopened.count() == 2
    assert reopened._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    reopened.close()


def test_save_with_the_same_id_replaces(path):
    store = ResponseStore(path)
    store.save(record())
    store.save(record(output_messages=(Message("assistant", "second"),)))
    assert store.count() == 1
    assert store.load("resp_1", "ns1").output_messages == (Message("assistant", "second"),)


def test_retention_by_count_drops_the_oldest(path):
    store = ResponseStore(path, max_rows=3, max_age_s=0)
    for i in range(5):
        store.save(record(f"resp_{i}"))
    assert store.prune() == 2
    assert [store.load(f"resp_{i}", "ns1") is not None for i in range(5)] == [False, False, True, True, True]


def test_retention_by_age(path):
    clock = Clock()
    store = ResponseStore(path, max_rows=0, max_age_s=100, clock=clock)
    store.save(record("resp_old"))
    clock.now += 60
    store.save(record("resp_new"))
    clock.now += 50
    assert store.prune() == 1
    assert store.load("resp_old", "ns1") is None and store.load("resp_new", "ns1") is not None


def test_saving_prunes_every_so_often(path, monkeypatch):
    monkeypatch.setattr("zllm.store.responses.PRUNE_EVERY", 4)
    store = ResponseStore(path, max_rows=2, max_age_s=0)
    for i in range(8):
        store.save(record(f"resp_{i}"))
    assert store.count() == 2


def test_opening_prunes(path):
    store = ResponseStore(path, max_rows=0)
    for i in range(4):
        store.save(record(f"resp_{i}"))
    store.close()
    assert ResponseStore(path, max_rows=1).count() == 1


def test_a_newer_schema_is_refused_with_a_hint(path):
    ResponseStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError) as caught:
        ResponseStore(path)
    assert f"schema v{SCHEMA_VERSION + 1}" in caught.value.message
    assert str(path) in caught.value.hint


def test_a_file_that_is_not_a_database_is_refused(path):
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        ResponseStore(path)


def test_concurrent_writers_and_readers_are_safe(path):
    store = ResponseStore(path, max_rows=0)
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(40):
                store.save(record(f"resp_{worker}_{i}"))
                assert store.load(f"resp_{worker}_{i}", "ns1") is not None
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert store.count() == 160


def test_two_connections_to_one_file(path):
    # a second daemon (or a restart overlapping the old process) on the same state dir
    one, two = ResponseStore(path), ResponseStore(path)
    one.save(record("resp_x"))
    assert two.load("resp_x", "ns1") is not None
    one.close()
    two.close()


def test_in_memory_store():
    store = ResponseStore.in_memory()
    store.save(record())
    assert store.load("resp_1", "ns1") == record()


# ---------------------------------------------------------------------- the byte bound


def big_record(response_id: str) -> StoredResponse:
    """About 100 KB once stored: random text compresses only so far."""
    import os as _os

    return record(response_id, input_messages=(Message("user", _os.urandom(100_000).hex()),))


def stored_size() -> int:
    from zllm.store.responses import _encode

    return len(_encode(big_record("resp_size")))


def test_the_byte_bound_evicts_the_oldest_on_every_save(path):
    bound = int(stored_size() * 3.5)
    store = ResponseStore(path, max_rows=0, max_age_s=0, max_bytes=bound)
    for n in range(10):  # no waiting for the sweep every PRUNE_EVERY saves
        store.save(big_record(f"resp_{n}"))
        assert store.stats()["bytes"] <= bound
    kept = [n for n in range(10) if store.load(f"resp_{n}", "ns1") is not None]
    assert kept == [7, 8, 9]  # the newest
    store.close()


def test_the_byte_bound_holds_across_a_restart_and_a_lower_setting(path):
    store = ResponseStore(path, max_bytes=0)
    for n in range(5):
        store.save(big_record(f"resp_{n}"))
    store.close()
    reopened = ResponseStore(path, max_bytes=int(stored_size() * 2.5))  # pruned on open
    assert reopened.stats()["rows"] == 2 and reopened.load("resp_4", "ns1") is not None
    reopened.close()


def test_a_manual_prune_by_size_and_age_then_compact_gives_the_disk_back(path):
    clock, size = Clock(), stored_size()
    store = ResponseStore(path, max_bytes=0, clock=clock)
    for n in range(6):
        store.save(big_record(f"resp_{n}"))
        clock.now += 60
    before = store.stats()
    assert before["rows"] == 6 and before["file_bytes"] >= before["bytes"] > 5 * size
    assert store.prune(older_than_s=150) == 4  # saved 360, 300, 240, 180 s ago
    assert store.prune(max_bytes=int(size * 1.5)) == 1
    store.compact()
    after = store.stats()
    assert (after["rows"], store.load("resp_5", "ns1") is not None) == (1, True)
    assert after["file_bytes"] < 2 * size
    assert store.prune(max_bytes=0) == 1 and store.stats()["bytes"] == 0
    store.close()


def test_replacing_a_row_does_not_count_it_twice(path):
    store = ResponseStore(path, max_bytes=0)
    store.save(big_record("resp_1"))
    once = store.stats()["bytes"]
    store.save(big_record("resp_1"))
    assert abs(store.stats()["bytes"] - once) < 1000 and store.stats()["rows"] == 1
    store.close()
