"""Disk is untrusted: corrupted, truncated and forged snapshots are rejected — a miss, never a crash — before
anything is allocated for them (damage in the tensor data itself: before any of it is copied, by the tensor
checksums), and quarantined (with the snapshots built on them)."""

import json
import sqlite3
import struct

import pytest
from safetensors import safe_open

from tests.unit.kvcache.conftest import LAYOUT, assert_state_equal, random_tokens, synthetic_state, torch_cache
from zllm.engine.torch.cache.pool import BufferPool
from zllm.kvcache.prefix_cache import PrefixCache
from zllm.engine.torch.cache.ssd_format import (
    CHUNK_TOKENS,
    MAX_CHECKSUMS,
    MAX_HEADER_BYTES,
    SnapshotInvalid,
    chunk_tokens_for,
)
from zllm.engine.torch.cache.ssd_tier import SnapshotJob, SnapshotStore, SsdMatch

TOKENS = random_tokens(200)


def write_snapshot(directory) -> str:
    store = SnapshotStore(directory, LAYOUT, 1 << 30)
    row = store.commit(SnapshotJob("snap", "ns", "m", TOKENS, 200, 1, ((0, synthetic_state(TOKENS)),)))
    store.close()
    return row.blob_name


def open_cache(directory) -> PrefixCache:
    return torch_cache(1 << 24, ssd_dir=directory, ssd_min_tokens=1)


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
    assert cache.kv.pool._staging is None  # validation failed before any buffer was sized from the file
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


def data_start(path) -> int:
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + n


def damage_bytes(path, offset: int, new: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[offset:offset + len(new)] = new
    path.write_bytes(bytes(data))


def flip_bit(path, offset: int) -> None:
    damage_bytes(path, offset, bytes([path.read_bytes()[offset] ^ 4]))


def old_format(header: dict) -> dict:
    """The header as the previous format wrote it: "zllm-kv-1", no tensor checksums."""
    meta = {k: v for k, v in header["__metadata__"].items() if k not in ("chunk_tokens", "xxh3_64")}
    return {**header, "__metadata__": {**meta, "format": "zllm-kv-1"}}


def cut_checksums(header: dict) -> dict:
    meta = header["__metadata__"]
    return {**header, "__metadata__": {**meta, "xxh3_64": meta["xxh3_64"][:-16]}}


TENSOR_DAMAGE = {  # the header is intact and the size unchanged: only the tensor checksums can tell
    "one bit flipped": lambda p: flip_bit(p, data_start(p) + 5000),
    "NaNs over a tensor": lambda p: damage_bytes(p, data_start(p), struct.pack("<f", float("nan")) * 200 * 32),
    "last byte": lambda p: flip_bit(p, p.stat().st_size - 1),
    "format without checksums": lambda p: rewrite_header(p, old_format),
    "checksums cut short": lambda p: rewrite_header(p, cut_checksums),
}


@pytest.mark.parametrize("name", sorted(TENSOR_DAMAGE))
def test_damaged_tensor_bytes_are_a_miss_and_quarantined(tmp_path, name) -> None:
    directory = tmp_path / "kv"
    blob = directory / "blobs" / write_snapshot(directory)
    TENSOR_DAMAGE[name](blob)
    cache = open_cache(directory)
    lease = cache.acquire("ns", TOKENS + (1,), max_new_tokens=1)
    assert (lease.cached_tokens, lease.tier) == (0, "cold") and "set aside" in lease.rejected
    cache.release(lease)
    stats = cache.stats()
    assert (stats.ssd_rejected, stats.ssd.quarantined, stats.ssd.snapshots) == (1, 1, 0)
    assert [p.name.split(".")[0] for p in (directory / "quarantine").iterdir()] == [blob.name.split(".")[0]]
    cache.close()


def test_a_prefix_restore_checks_the_chunks_it_reads_and_only_those(tmp_path) -> None:
    """Chunks are CHUNK_TOKENS long: damage in the last chunk does not cost a restore of the first 100 tokens
    (nothing damaged is copied), damage in the first chunk does."""
    tokens = random_tokens(600)
    directory = tmp_path / "kv"
    store = SnapshotStore(directory, LAYOUT, 1 << 30)
    row = store.commit(SnapshotJob("long", "ns", "m", tokens, 600, 1, ((0, synthetic_state(tokens)),)))
    blob = directory / "blobs" / row.blob_name
    per_token = LAYOUT.layers[0][0].row_bytes
    damage_bytes(blob, data_start(blob) + 590 * per_token, b"\xff" * 8)  # layer 0's keys, token 590
    pool = BufferPool(LAYOUT, "cpu")
    dest = LAYOUT.empty(100)
    store.restore(SsdMatch(row, 100), dest, pool)
    assert_state_equal(dest, tokens, 100)
    damage_bytes(blob, data_start(blob) + 10 * per_token, b"\xff" * 8)  # token 10: inside what is restored
    with pytest.raises(SnapshotInvalid, match="checksum"):
        store.restore(SsdMatch(row, 100), LAYOUT.empty(100), pool)
    assert store.snapshots() == [] and store.stats().quarantined == 1
    store.close()


def test_long_blobs_get_longer_chunks_so_the_header_stays_bounded() -> None:
    for tokens, tensors in ((600, 4), (32_768, 128), (1 << 21, 128)):
        chunk = chunk_tokens_for(tokens, tensors)
        assert chunk >= CHUNK_TOKENS and -(-tokens // chunk) * tensors <= MAX_CHECKSUMS
        assert -(-tokens // chunk) * tensors * 16 <= MAX_HEADER_BYTES // 2  # the checksums leave room for the rest
    assert chunk_tokens_for(600, 4) == CHUNK_TOKENS
