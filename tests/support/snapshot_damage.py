"""Every kind of damage to an SSD tier directory, for both backends' tiers: what the cache contract's damage
matrix (tests/unit/kvcache/test_cache_contract.py) and the runtime's forged-row tests
(tests/unit/runtime/test_snapshot_damage.py) do to a tier on disk."""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path

from zllm.kvcache import ssd_index

NAN = struct.pack("<f", float("nan"))


def tier_dir(tmp_path: Path, backend: str) -> Path:
    return tmp_path / ("kv" if backend == "torch" else f"kv-{backend}")  # runtime/prefix.py names them so


def blobs(directory: Path) -> list[Path]:
    """The snapshots' blobs, oldest first (generation order): the first conversation's is first."""
    return sorted((directory / "blobs").iterdir())


def flip(blob: Path) -> None:
    data = bytearray(blob.read_bytes())
    data[len(data) * 2 // 3] ^= 0x10  # well inside the data: headers are a small part of these files
    blob.write_bytes(bytes(data))


def nan_fill(blob: Path) -> None:
    data = bytearray(blob.read_bytes())
    at = len(data) // 2 // 4 * 4
    data[at:at + 256] = NAN * 64
    blob.write_bytes(bytes(data))


def swap(first: Path, second: Path) -> None:
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)


def to_directory(blob: Path) -> None:
    blob.unlink()
    blob.mkdir()
    (blob / "x").write_bytes(b"not a blob")


def old_format(blob: Path) -> None:
    """Replace a blob's frame with an older zllm's (same payload, the index row's size kept right): torch's
    safetensors "zllm-kv-2" header, so a reader that skipped the magic would find plausible sizes and tokens."""
    data = blob.read_bytes()
    (n,) = struct.unpack_from("<I", data, 8)
    header = json.loads(data[12:12 + n])
    old = json.dumps({"__metadata__": {"format": "zllm-kv-2", "layout": header["layout"],
                                       "tokens": str(header["tokens"]), "token_sha256": header["token_sha256"]}},
                     separators=(",", ":")).encode()
    old += b" " * (-len(old) % 8)
    blob.write_bytes(struct.pack("<Q", len(old)) + old + data[12 + n:])
    db = sqlite3.connect(blob.parent.parent / "index.sqlite")  # as the old writer indexed it: its own size
    db.execute("UPDATE snapshots SET bytes = ? WHERE generation = ?", (blob.stat().st_size, int(blob.stem, 16)))
    db.commit()
    db.close()


def garbage_index(directory: Path) -> None:
    (directory / "index.sqlite").write_bytes(b"\x00garbage, not a database\xff" * 400)


def future_index(directory: Path) -> None:
    db = sqlite3.connect(directory / "index.sqlite")
    db.execute(f"PRAGMA user_version = {ssd_index.SCHEMA_VERSION + 1}")
    db.commit()
    db.close()


# what each damage does to the tier directory
BLOB_DAMAGE = {
    "missing": lambda d: blobs(d)[0].unlink(),
    "truncated": lambda d: (b := blobs(d)[0]).write_bytes(b.read_bytes()[:b.stat().st_size // 2]),
    "enlarged": lambda d: (b := blobs(d)[0]).write_bytes(b.read_bytes() + b"\0" * 4096),
    "flipped": lambda d: flip(blobs(d)[0]),
    "nan-filled": lambda d: nan_fill(blobs(d)[0]),
    "swapped": lambda d: swap(*blobs(d)),
    "directory": lambda d: to_directory(blobs(d)[0]),
    "old-format": lambda d: old_format(blobs(d)[0]),
}
INDEX_DAMAGE = {"garbage-index": garbage_index, "future-index": future_index}
