"""The one SSD snapshot format, for every backend: a frame around the bytes a backend's KV exports.

    b"ZLLMKV3\\n" | u32 LE header length | header JSON | payload

    header = {"layout": "<what makes the payload loadable: model, backend, KV types>", "tokens": 600,
              "token_sha256": "<sha256 of the token ids, int32 LE>", "token_bytes": 512,
              "payload_bytes": 307200, "chunk_bytes": 1048576, "xxh3_64": "<16 hex digits per chunk>"}

The payload is opaque here. `token_bytes` > 0 says it is token-major (the torch backend's: token t's KV, every
layer's k and v, at bytes [t * token_bytes, (t + 1) * token_bytes)), so the first n tokens are its first
n * token_bytes bytes and a restore of a range reads only that range; 0 says it is read whole (llama.cpp's
state blob). Either way the payload is checksummed in chunks of `chunk_bytes` (XXH3-64 via xxhash: it must
cost little next to the read; it guards against damage, not against someone who can write the cache directory),
and a read checks every chunk it touches before a byte of it is returned.

A read trusts nothing it did not check: the magic (older formats — torch's safetensors "zllm-kv-1"/"zllm-kv-2",
llama.cpp's "ZLLMSEQ1" — fail here and are set aside), the header's bounds, that the header names the index
row's layout, tokens and token hash, that the sizes add up to the file's, and the chunks' checksums.
"""

from __future__ import annotations

import json
import os
import struct

import xxhash

from zllm.kvcache.ssd_index import SnapshotInvalid

MAGIC = b"ZLLMKV3\n"
PREFIX = len(MAGIC) + 4
MAX_HEADER = 1 << 22  # 16 hex digits a chunk: room for 256K chunks (256 GB at 1 MiB)
CHUNK_BYTES = 1 << 20
DIGITS = 16


def chunk_checksums(data) -> str:
    """The checksums of `data`'s CHUNK_BYTES chunks, concatenated (any bytes-like: a view is not copied)."""
    view = memoryview(data).cast("B")
    return "".join(xxhash.xxh3_64_hexdigest(view[i:i + CHUNK_BYTES]) for i in range(0, len(view), CHUNK_BYTES))


def frame(*, layout: str, tokens: int, token_sha256: str, token_bytes: int, payload) -> bytes:
    """The bytes before the payload."""
    header = json.dumps({"layout": layout, "tokens": tokens, "token_sha256": token_sha256,
                         "token_bytes": token_bytes, "payload_bytes": len(memoryview(payload).cast("B")),
                         "chunk_bytes": CHUNK_BYTES, "xxh3_64": chunk_checksums(payload)}).encode()
    return MAGIC + struct.pack("<I", len(header)) + header


def read_payload(path, *, layout: str, tokens: int, token_sha256: str, token_bytes: int,
                 first: int = 0, stop: int | None = None) -> memoryview:
    """Payload bytes [first, stop) (stop None: to the end), verified; SnapshotInvalid when anything is off. The
    view is over a writable buffer of its own (an engine can load from it without another copy)."""
    name = os.path.basename(path)
    try:
        if not os.path.isfile(path):
            raise SnapshotInvalid(f"{name} is not a file")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header, start = _header(f, size, name)
            payload = size - start
            _check(header, name, layout=layout, tokens=tokens, token_sha256=token_sha256, token_bytes=token_bytes,
                   payload=payload)
            stop = payload if stop is None else stop
            if not 0 <= first < stop <= payload:
                raise SnapshotInvalid(f"{name}: bytes [{first}, {stop}) are not in a {payload}-byte payload")
            low, high = first // CHUNK_BYTES * CHUNK_BYTES, min(-(-stop // CHUNK_BYTES) * CHUNK_BYTES, payload)
            data = memoryview(bytearray(high - low))
            f.seek(start + low)
            _read_checked(f, data, header["xxh3_64"], low // CHUNK_BYTES, name)
    except OSError as exc:
        raise SnapshotInvalid(f"{name}: {exc}") from exc
    return data[first - low:stop - low]


def _read_checked(f, data: memoryview, sums: str, first_chunk: int, name: str) -> None:
    """Fill `data` chunk by chunk, each checked while it is still in the CPU's cache (so the check costs hashing,
    not another trip through memory)."""
    for index, at in enumerate(range(0, len(data), CHUNK_BYTES), start=first_chunk):
        chunk = data[at:at + CHUNK_BYTES]
        if f.readinto(chunk) != len(chunk):
            raise SnapshotInvalid(f"{name} changed while it was read")
        if xxhash.xxh3_64_hexdigest(chunk) != sums[index * DIGITS:(index + 1) * DIGITS]:
            raise SnapshotInvalid(f"{name}: payload bytes fail their checksum (truncated or damaged)")


def validate(path, **expected) -> None:
    """The frame and header of the blob at `path` hold (check_integrity); its chunks are checked at read."""
    name = os.path.basename(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header, start = _header(f, size, name)
        _check(header, name, payload=size - start, **expected)


def _header(f, size: int, name: str) -> tuple[dict, int]:
    prefix = f.read(PREFIX)
    if len(prefix) < PREFIX or prefix[:len(MAGIC)] != MAGIC:
        raise SnapshotInvalid(f"{name}: not a zllm snapshot of this format (an older zllm's, or damaged)")
    (length,) = struct.unpack_from("<I", prefix, len(MAGIC))
    if length > MAX_HEADER or PREFIX + length > size:
        raise SnapshotInvalid(f"{name}: header length {length} is impossible")
    try:
        header = json.loads(f.read(length))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotInvalid(f"{name}: unreadable header") from exc
    if not isinstance(header, dict):
        raise SnapshotInvalid(f"{name}: header is not a JSON object")
    return header, PREFIX + length


def _check(header: dict, name: str, *, layout: str, tokens: int, token_sha256: str, token_bytes: int,
           payload: int) -> None:
    expected = {"layout": layout, "tokens": tokens, "token_sha256": token_sha256, "token_bytes": token_bytes}
    if any(header.get(k) != v for k, v in expected.items()):
        raise SnapshotInvalid(f"{name}: written for another model, layout or token sequence")
    if header.get("payload_bytes") != payload or (token_bytes and payload != tokens * token_bytes):
        raise SnapshotInvalid(f"{name}: {payload} payload bytes, the header says {header.get('payload_bytes')!r}")
    sums = header.get("xxh3_64")
    if header.get("chunk_bytes") != CHUNK_BYTES or not isinstance(sums, str) \
            or len(sums) != -(-payload // CHUNK_BYTES) * DIGITS:
        raise SnapshotInvalid(f"{name}: checksums do not cover the payload")
