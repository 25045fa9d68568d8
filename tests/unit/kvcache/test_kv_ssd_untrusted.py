"""Disk is untrusted: corrupted, truncated and forged snapshots are rejected — a miss, never a crash — before
anything is allocated for them, and quarantined (with the snapshots built on them)."""

import json
import sqlite3
import struct

import pytest
from safetensors import safe_open

from tests.unit.kvcache.conftest import LAYOUT, assert_state_equal, random_tokens, synthetic_state
from zllm.kvcache import CacheConfig, PrefixCache
from zllm.kvcache.ssd_tier import SnapshotJob, SnapshotStore

TOKENS = random_tokens(200)


def write_snapshot(directory) -> str:
    store = SnapshotStore(directory, LAYOUT, 1 << 30)
    row = store.commit(SnapshotJob("snap", "ns", "m", TOKENS, 200, 1, ((0, synthetic_state(TOKENS)),)))
    store.close()
    return row.blob_name


def open_cache(directory) -> PrefixCache:
    return PrefixCache(CacheConfig(device_budget_bytes=1 << 24, ssd_dir=directory, ssd_min_tokens=1), LAYOUT, "cpu")


def rewrite_header(path, edit) -> None:
    """Replace the JSON header with `edit(header)` and fix the index's size for the file (a thorough forger)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    encoded = json.dumps(edit(json.loads(data[8:8 + n])), separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + n:])
    fix_indexed_size(path)


def fix_indexed_size(path) -> None:
    db = sqlite3.connect(path.parent.parent / "index.sqlite")
    db.execute("UPDATE snapshots SET bytes = ?", (path.stat().st_size,))
    db.commit()
    db.close()


def first_tensor(header) -> dict:
    return header["0.0"]


CORRUPTIONS = {
    "huge header length": lambda p: p.write_bytes(struct.pack("<Q", 1 << 62) + p.read_bytes()[8:]),
    "trailing bytes": lambda p: (p.write_bytes(p.read_bytes() + b"\0" * 64), fix_indexed_size(p)),
    "short data": lambda p: (p.write_bytes(p.read_bytes()[:-512]), fix_indexed_size(p)),
    "header not json": lambda p: p.write_bytes(p.read_bytes()[:8] + b"\xff" * 32 + p.read_bytes()[40:]),
    "huge shape": lambda p: rewrite_header(p, lambda h: {**h, "0.0": {**first_tensor(h), "shape": [1 << 40, 1, 2, 16]}}),
    "wrong dtype": lambda p: rewrite_header(p, lambda h: {**h, "0.0": {**first_tensor(h), "dtype": "F16"}}),
    "overlapping offsets": lambda p: rewrite_header(p, lambda h: {**h, "0.1": {**h["0.1"], "data_offsets": h["0.0"]["data_offsets"]}}),
    "bool in shape": lambda p: rewrite_header(p, lambda h: {**h, "0.0": {**first_tensor(h), "shape": [200, True, 2, 16]}}),
    "other tokens": lambda p: rewrite_header(p, lambda h: {**h, "__metadata__": {**h["__metadata__"], "token_sha256": "0" * 64}}),
    "other layout": lambda p: rewrite_header(p, lambda h: {**h, "__metadata__": {**h["__metadata__"], "layout": "f" * 16}}),
    "missing tensor": lambda p: rewrite_header(p, lambda h: {k: v for k, v in h.items() if k != "1.1"}),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_blob_is_a_miss_and_quarantined(tmp_path, name) -> None:
    directory = tmp_path / "kv"
    blob = directory / "blobs" / write_snapshot(directory)
    CORRUPTIONS[name](blob)
    cache = open_cache(directory)  # the file's size matches the index: only reading the header can tell
    lease = cache.acquire("ns", TOKENS + (1,), max_new_tokens=1)
    assert (lease.cached_tokens, lease.tier) == (0, "cold")
    assert cache.pool._staging is None  # validation failed before any buffer was sized from the file
    cache.release(lease)
    assert cache.store.snapshots() == [] and [p.name.split(".")[0] for p in (directory / "quarantine").iterdir()] \
        == [blob.name.split(".")[0]]
    assert cache.stats()["ssd_rejected"] == 1
    cache.check_integrity()
    cache.close()


@pytest.mark.parametrize("damage", ["truncate", "append", "delete"])
def test_files_that_changed_size_are_quarantined_on_open(tmp_path, damage) -> None:
    directory = tmp_path / "kv"
    blob = directory / "blobs" / write_snapshot(directory)
    data = blob.read_bytes()
    if damage == "truncate":
        blob.write_bytes(data[:len(data) // 2])
    elif damage == "append":
        blob.write_bytes(data + b"\0" * 64)
    else:
        blob.unlink()
    store = SnapshotStore(directory, LAYOUT, 1 << 30)
    assert store.snapshots() == [] and store.lookup("ns", TOKENS) == (None, None)
    store.check_integrity()
    store.close()


def test_a_file_truncated_while_running_fails_the_read_not_the_process(tmp_path) -> None:
    directory = tmp_path / "kv"
    blob = directory / "blobs" / write_snapshot(directory)
    cache = open_cache(directory)
    blob.write_bytes(blob.read_bytes()[:1000])
    lease = cache.acquire("ns", TOKENS + (1,), max_new_tokens=1)
    assert lease.tier == "cold"
    cache.release(lease)
    cache.close()


def test_forged_index_rows_are_dropped_on_open(tmp_path) -> None:
    directory = tmp_path / "kv"
    write_snapshot(directory)
    db = sqlite3.connect(directory / "index.sqlite")
    columns = "id, namespace, model, parent, parent_len, tokens, generation, bytes, round, prompt_len, hint_key, " \
              "created, last_used, hits"
    forged = [
        ("odd", "ns", "m", None, 0, b"\x01\x02\x03", 100, 10, 1, 0, None, 0.0, 0.0, 0),  # not int32s
        ("loop", "ns", "m", "loop", 5, b"\0" * 40, 101, 10, 1, 0, None, 0.0, 0.0, 0),  # its own parent
        ("orphan", "ns", "m", "nobody", 5, b"\0" * 40, 102, 10, 1, 0, None, 0.0, 0.0, 0),
        ("text", "ns", "m", None, 0, "not a blob", 103, 10, 1, 0, None, 0.0, 0.0, 0),
        ("lies", "ns", "m", "snap", 150, b"\x07" * 800, 104, 10, 1, 0, None, 0.0, 0.0, 0),  # tokens disagree
    ]
    db.executemany(f"INSERT INTO snapshots ({columns}) VALUES ({', '.join('?' * 14)})", forged)
    db.commit()
    db.close()
    store = SnapshotStore(directory, LAYOUT, 1 << 30)
    assert [r.id for r in store.snapshots()] == ["snap"]
    store.check_integrity()
    store.close()


def test_blobs_are_standard_safetensors(tmp_path) -> None:
    directory = tmp_path / "kv"
    blob = directory / "blobs" / write_snapshot(directory)
    with safe_open(str(blob), framework="pt") as f:
        keys = f.get_tensor("0.0")  # token-major: [tokens, 1, kv_heads, head_dim]
        assert f.metadata()["tokens"] == "200"
    assert_state_equal(((keys.movedim(0, -2), keys.movedim(0, -2).neg()),) + synthetic_state(TOKENS)[1:], TOKENS)
