"""Disk is untrusted: corrupted, truncated and forged snapshots of the one format (kvcache/snapshot_frame.py) are
rejected — a miss, never a crash — before a byte reaches the backend (damage in the payload itself: by the chunk
checksums), and quarantined. Torch payloads here; the damage matrix on both backends is test_cache_contract.py."""

import json
import sqlite3
import struct

import pytest

from tests.unit.kvcache.conftest import assert_state_equal, random_tokens, restore_state, torch_cache, torch_job
from tests.unit.kvcache.conftest import torch_store
from zllm.kvcache import snapshot_frame
from zllm.kvcache.prefix_cache import PrefixCache
from zllm.kvcache.snapshot_frame import CHUNK_BYTES, DIGITS, MAX_HEADER, PREFIX
from zllm.kvcache.snapshot_store import SnapshotMatch
from zllm.kvcache.ssd_index import SnapshotInvalid

TOKENS = random_tokens(200)
BPT = 512


def write_snapshot(directory) -> str:
    store = torch_store(directory)
    row = store.commit(torch_job("snap", TOKENS))
    store.close()
    return row.blob_name


def open_cache(directory) -> PrefixCache:
    return torch_cache(1 << 24, ssd_dir=directory, ssd_min_tokens=1)


def header_length(data: bytes) -> int:
    return struct.unpack_from("<I", data, 8)[0]


def rewrite_header(path, edit) -> None:
    """Replace the JSON header with `edit(header)` and fix the index's size for the file (a thorough forger)."""
    data = path.read_bytes()
    n = header_length(data)
    encoded = json.dumps(edit(json.loads(data[PREFIX:PREFIX + n]))).encode()
    path.write_bytes(data[:8] + struct.pack("<I", len(encoded)) + encoded + data[PREFIX + n:])
    fix_indexed_size(path)


def fix_indexed_size(path) -> None:
    db = sqlite3.connect(path.parent.parent / "index.sqlite")
    db.execute("UPDATE snapshots SET bytes = ?", (path.stat().st_size,))
    db.commit()
    db.close()


def payload_start(path) -> int:
    return PREFIX + header_length(path.read_bytes())


CORRUPTIONS = {
    "huge header length": lambda p: p.write_bytes(p.read_bytes()[:8] + struct.pack("<I", (1 << 32) - 1)
                                                  + p.read_bytes()[PREFIX:]),
    "trailing bytes": lambda p: (p.write_bytes(p.read_bytes() + b"\0" * 64), fix_indexed_size(p)),
    "short data": lambda p: (p.write_bytes(p.read_bytes()[:-64]), fix_indexed_size(p)),
    "header not json": lambda p: p.write_bytes(p.read_bytes()[:PREFIX] + b"\xff" * 32 + p.read_bytes()[PREFIX + 32:]),
    "header not an object": lambda p: rewrite_header(p, lambda h: [h]),
    "other magic": lambda p: p.write_bytes(b"ZLLMSEQ1" + p.read_bytes()[8:]),
    "other tokens": lambda p: rewrite_header(p, lambda h: {**h, "token_sha256": "0" * 64}),
    "other layout": lambda p: rewrite_header(p, lambda h: {**h, "layout": "f" * 16}),
    "other token bytes": lambda p: rewrite_header(p, lambda h: {**h, "token_bytes": 256}),
    "payload size lies": lambda p: rewrite_header(p, lambda h: {**h, "payload_bytes": h["payload_bytes"] + 1}),
    "other chunk size": lambda p: rewrite_header(p, lambda h: {**h, "chunk_bytes": 4096}),
    "checksums cut short": lambda p: rewrite_header(p, lambda h: {**h, "xxh3_64": h["xxh3_64"][:-DIGITS]}),
    "checksums missing": lambda p: rewrite_header(p, lambda h: {k: v for k, v in h.items() if k != "xxh3_64"}),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_blob_is_a_miss_and_quarantined(tmp_path, name) -> None:
    directory = tmp_path / "kv"
    blob = directory / "blobs" / write_snapshot(directory)
    CORRUPTIONS[name](blob)
    cache = open_cache(directory)  # the file's size matches the index: only reading the frame can tell
    lease = cache.acquire("ns", TOKENS + (1,), max_new_tokens=1)
    assert (lease.cached_tokens, lease.tier) == (0, "cold") and "set aside" in lease.rejected
    cache.release(lease)
    assert cache.store.snapshots() == [] and [p.name.split(".")[0] for p in (directory / "quarantine").iterdir()] \
        == [blob.name.split(".")[0]]
    assert cache.stats().ssd_rejected == 1
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
    store = torch_store(directory)
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
        ("chained", "ns", "m", "snap", 150, b"\x07" * 800, 104, 10, 1, 0, None, 0.0, 0.0, 0),  # this store chains none
    ]
    db.executemany(f"INSERT INTO snapshots ({columns}) VALUES ({', '.join('?' * 14)})", forged)
    db.commit()
    db.close()
    store = torch_store(directory)
    assert [r.id for r in store.snapshots()] == ["snap"]
    store.check_integrity()
    store.close()


def damage_bytes(path, offset: int, new: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[offset:offset + len(new)] = new
    path.write_bytes(bytes(data))


def flip_bit(path, offset: int) -> None:
    damage_bytes(path, offset, bytes([path.read_bytes()[offset] ^ 4]))


PAYLOAD_DAMAGE = {  # the frame is intact and the size unchanged: only the chunk checksums can tell
    "one bit flipped": lambda p: flip_bit(p, payload_start(p) + 5000),
    "NaNs over a token's KV": lambda p: damage_bytes(p, payload_start(p), struct.pack("<f", float("nan")) * 128),
    "last byte": lambda p: flip_bit(p, p.stat().st_size - 1),
}


@pytest.mark.parametrize("name", sorted(PAYLOAD_DAMAGE))
def test_damaged_payload_bytes_are_a_miss_and_quarantined(tmp_path, name) -> None:
    directory = tmp_path / "kv"
    blob = directory / "blobs" / write_snapshot(directory)
    PAYLOAD_DAMAGE[name](blob)
    cache = open_cache(directory)
    lease = cache.acquire("ns", TOKENS + (1,), max_new_tokens=1)
    assert (lease.cached_tokens, lease.tier) == (0, "cold") and "set aside" in lease.rejected
    cache.release(lease)
    stats = cache.stats()
    assert (stats.ssd_rejected, stats.ssd.quarantined, stats.ssd.snapshots) == (1, 1, 0)
    assert [p.name.split(".")[0] for p in (directory / "quarantine").iterdir()] == [blob.name.split(".")[0]]
    cache.close()


def test_a_prefix_restore_checks_the_chunks_it_reads_and_only_those(tmp_path, monkeypatch) -> None:
    """With chunks of 100 tokens: damage at token 590 does not cost a restore of the first 100 tokens (nothing
    damaged is returned), damage at token 10 does."""
    monkeypatch.setattr(snapshot_frame, "CHUNK_BYTES", 100 * BPT)
    tokens = random_tokens(600)
    directory = tmp_path / "kv"
    store = torch_store(directory)
    row = store.commit(torch_job("long", tokens))
    blob = directory / "blobs" / row.blob_name
    damage_bytes(blob, payload_start(blob) + 590 * BPT, b"\xff" * 8)
    assert_state_equal(restore_state(store, SnapshotMatch(row, 100)), tokens, 100)
    damage_bytes(blob, payload_start(blob) + 10 * BPT, b"\xff" * 8)  # token 10: inside what is restored
    with pytest.raises(SnapshotInvalid, match="checksum"):
        store.read(SnapshotMatch(row, 100), 0)
    assert store.snapshots() == [] and store.stats().quarantined == 1
    store.close()


def test_the_header_has_room_for_the_checksums_of_a_large_snapshot() -> None:
    """128K tokens of a 70B-class model's KV (~320 KB a token in f16): about 40 GB, its checksums well inside."""
    payload = (128 << 10) * (320 << 10)
    assert -(-payload // CHUNK_BYTES) * DIGITS + 1024 <= MAX_HEADER // 4
