"""Snapshot blob files: safetensors, written by us, read as untrusted input.

    [u64 LE header_len][header JSON, space-padded to 8 bytes][tensor data, back to back, no gaps]

    header = {"__metadata__": {"format": "zllm-kv-2", "layout": "<KVLayout.key>", "tokens": "600",
                               "token_sha256": "<sha256 of the blob's own token ids, int32 LE>",
                               "chunk_tokens": "256", "xxh3_64": "<16 hex digits per chunk per tensor>"},
              "0.0": {"dtype": "F32", "shape": [600, 1, 2, 16], "data_offsets": [0, 76800]},   # layer 0, k
              "0.1": {...}, "1.0": {...}, ...}                                                  # layer 0, v; ...

Tensors are stored **token-major** (`[tokens, *row_shape]`, the in-memory `[1, kv_heads, tokens, head_dim]`
with the token axis moved to the front), so the first `n` tokens of a tensor are one contiguous byte range:
a restore of a prefix reads only that prefix.

Every tensor's bytes are checksummed in chunks of `chunk_tokens` tokens (XXH3-64 via xxhash, the fastest
well-kept non-cryptographic hash: it guards against damage, not against someone who can write the cache
directory, who could as well write the index). A restore reads whole chunks, in pieces small enough to stay
in the CPU's cache while they are hashed and copied, and checks each before a byte of it is copied into the
destination: a flipped bit or NaNs written over a tensor is `SnapshotInvalid`, never served
(bench/ssd_checksum.py measures what the check adds to a restore). Blobs of the previous format
("zllm-kv-1", no checksums) fail the format check the same way: a miss, set aside.

`read_header` validates everything before the caller allocates anything: header length against a cap
and the file size, JSON shape, names, dtypes, shapes (against the expected layout and token count), that
offsets tile the data area exactly (no overlap, no gap, no trailing bytes) and the metadata's binding to
the index row (format, layout, token count and hash). A blob that fails is `SnapshotInvalid`.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from zllm.engine.torch.cache.state import DTYPES_BY_NAME, KVLayout, KVState, dtype_name
from zllm.kvcache.ssd_index import SnapshotInvalid

FORMAT = "zllm-kv-2"
MAX_HEADER_BYTES = 1 << 20  # 1 MiB: thousands of layers' entries; anything larger is not ours
CHUNK_TOKENS = 256  # the checksum granularity: a prefix restore reads at most this many tokens more per tensor
PIECE_BYTES = 1 << 19  # a restore reads, checks and copies this much at a time: it stays in the CPU's cache
MAX_CHECKSUMS = 1 << 15  # per blob (16 hex digits each: half the header cap); longer blobs get longer chunks
_DIGITS = 16
_ALIGN = 8


@dataclass(frozen=True)
class TensorExtent:
    offset: int  # absolute file offset of the tensor's first byte
    nbytes: int
    row_bytes: int  # bytes per token
    checksums: tuple[str, ...] = ()  # XXH3-64 hex per chunk of the header's chunk_tokens tokens


@dataclass(frozen=True)
class BlobHeader:
    tokens: int
    extents: tuple[tuple[TensorExtent, ...], ...]  # per layer, per tensor
    chunk_tokens: int = CHUNK_TOKENS

    def chunk_span(self, first: int, count: int) -> tuple[int, int]:
        """The whole chunks covering tokens [first, first+count): what a checked read of them reads."""
        low = first // self.chunk_tokens * self.chunk_tokens
        high = min(-(-(first + count) // self.chunk_tokens) * self.chunk_tokens, self.tokens)
        return low, high


def chunk_tokens_for(tokens: int, tensors: int) -> int:
    """The checksum chunk: CHUNK_TOKENS, doubled until the blob's checksums fit MAX_CHECKSUMS."""
    chunk = CHUNK_TOKENS
    while -(-tokens // chunk) * tensors > MAX_CHECKSUMS:
        chunk *= 2
    return chunk


def chunk_checksums(data: memoryview, row_bytes: int, chunk_tokens: int) -> list[str]:
    """XXH3-64 of each `chunk_tokens`-token piece of one tensor's token-major bytes (the last may be shorter)."""
    step = row_bytes * chunk_tokens
    return [xxhash.xxh3_64_hexdigest(data[i:i + step]) for i in range(0, len(data), step)]


def tensor_name(layer: int, index: int) -> str:
    return f"{layer}.{index}"


def write_blob(path: Path, state: KVState, layout: KVLayout, token_sha256: str) -> int:
    """Write `state` (tokens on axis -2) to `path` and fsync it; returns the file size.

    The caller writes to a temporary name and renames after this returns (the commit protocol lives in
    ssd_tier.py); this function only guarantees the bytes are on disk when it returns.
    """
    tokens = layout.check(state)
    rows = [[t.movedim(-2, 0).contiguous().cpu() for t in layer] for layer in state]  # [tokens, *row_shape]
    chunk = chunk_tokens_for(tokens, sum(len(layer) for layer in rows))
    checksums: list[str] = []
    header: dict[str, object] = {"__metadata__": {}}  # filled once the checksums are known; first, as is usual
    offset = 0
    for i, layer in enumerate(rows):
        for j, t in enumerate(layer):
            header[tensor_name(i, j)] = {"dtype": dtype_name(t.dtype), "shape": list(t.shape),
                                         "data_offsets": [offset, offset + t.nbytes]}
            offset += t.nbytes
            flat = t.view(torch.uint8).view(-1).numpy().data
            checksums += chunk_checksums(flat, layout.layers[i][j].row_bytes, chunk)
    header["__metadata__"] = {"format": FORMAT, "layout": layout.key, "tokens": str(tokens),
                              "token_sha256": token_sha256, "chunk_tokens": str(chunk), "xxh3_64": "".join(checksums)}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % _ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for layer in rows:
            for t in layer:
                f.write(t.view(torch.uint8).numpy().data)  # flat bytes, no copy
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def read_header(f, file_size: int, layout: KVLayout, tokens: int, token_sha256: str) -> BlobHeader:
    """Parse and validate an open blob against what the index says it holds; raises SnapshotInvalid."""
    if file_size < 8:
        raise SnapshotInvalid("file shorter than its header length field")
    f.seek(0)
    (header_len,) = struct.unpack("<Q", f.read(8))
    if header_len > MAX_HEADER_BYTES or 8 + header_len > file_size:
        raise SnapshotInvalid(f"header length {header_len} is impossible for a {file_size}-byte file")
    try:
        header = json.loads(f.read(header_len))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotInvalid(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SnapshotInvalid("header is not a JSON object")
    meta = header.pop("__metadata__", None)
    _check_metadata(meta, layout, tokens, token_sha256)
    chunk, checksums = _checksums(meta, tokens, sum(len(layer) for layer in layout.layers))
    expected_names = {tensor_name(i, j) for i, layer in enumerate(layout.layers) for j in range(len(layer))}
    if set(header) != expected_names:
        raise SnapshotInvalid("tensor names do not match the layout")
    data_start = 8 + header_len
    extents, cursor = [], 0
    for i, layer in enumerate(layout.layers):
        layer_extents = []
        for j, spec in enumerate(layer):
            begin, end = _check_tensor(header[tensor_name(i, j)], spec.dtype, (tokens, *spec.row_shape))
            if begin != cursor:  # tensors tile the data area in order: no gap, no overlap
                raise SnapshotInvalid(f"tensor {tensor_name(i, j)} does not start where the previous ended")
            cursor = end
            layer_extents.append(TensorExtent(data_start + begin, end - begin, spec.row_bytes, next(checksums)))
        extents.append(tuple(layer_extents))
    if data_start + cursor != file_size:
        raise SnapshotInvalid(f"file is {file_size} bytes, header accounts for {data_start + cursor}")
    return BlobHeader(tokens, tuple(extents), chunk)


def read_range_into(f, header: BlobHeader, first: int, count: int, dest: KVState, dest_start: int,
                    layout: KVLayout, staging: torch.Tensor) -> None:
    """Copy the blob's tokens [first, first+count) into dest[..., dest_start:dest_start+count, :].

    Token-major storage makes that one contiguous byte range per tensor: the whole checksum chunks covering
    the tokens (`header.chunk_span`). It is read in pieces of about PIECE_BYTES, each checked and copied while
    it is still in the CPU's cache (so the check costs hashing, not another trip through memory), and nothing
    is copied before its chunk passed. `staging` is a flat uint8 buffer of at least `staging_bytes(...)`.
    """
    assert 0 <= first and 0 < count and first + count <= header.tokens
    low, high = header.chunk_span(first, count)
    shift = dest_start - first  # blob token t lands at dest position t + shift
    for layer_index, (layer_extents, specs) in enumerate(zip(header.extents, layout.layers)):
        for tensor_index, (extent, spec) in enumerate(zip(layer_extents, specs)):
            name, target = tensor_name(layer_index, tensor_index), dest[layer_index][tensor_index]
            step = _piece_tokens(header, extent.row_bytes)
            for piece in range(low, high, step):
                rows = _checked_piece(f, header, extent, spec, name, piece, min(piece + step, high), staging)
                lo, hi = max(piece, first), min(piece + step, first + count)  # the part the caller asked for
                if lo < hi:  # synchronous: the staging buffer is reused for the next piece right away
                    target[..., lo + shift:hi + shift, :].copy_(rows[lo - piece:hi - piece].movedim(0, -2))


def staging_bytes(header: BlobHeader, first: int, count: int) -> int:
    """The staging buffer `read_range_into(header, first, count, ...)` needs: its largest piece."""
    low, high = header.chunk_span(first, count)
    return max(min(high - low, _piece_tokens(header, extent.row_bytes)) * extent.row_bytes
               for layer in header.extents for extent in layer)


def _piece_tokens(header: BlobHeader, row_bytes: int) -> int:
    """Whole chunks, about PIECE_BYTES of them (at least one chunk)."""
    return max(1, PIECE_BYTES // (row_bytes * header.chunk_tokens)) * header.chunk_tokens


def _checked_piece(f, header: BlobHeader, extent: TensorExtent, spec, name: str, low: int, high: int,
                   staging: torch.Tensor) -> torch.Tensor:
    """Tokens [low, high) of one tensor (whole chunks), read into `staging` and checked: [n, *row_shape]."""
    nbytes = (high - low) * extent.row_bytes
    buffer = staging[:nbytes]
    f.seek(extent.offset + low * extent.row_bytes)
    if f.readinto(buffer.numpy().data) != nbytes:
        raise SnapshotInvalid("blob ended early")  # the file changed under us since validation
    first_chunk = low // header.chunk_tokens
    got = chunk_checksums(buffer.numpy().data, extent.row_bytes, header.chunk_tokens)
    if got != list(extent.checksums[first_chunk:first_chunk + len(got)]):
        raise SnapshotInvalid(f"tensor {name} fails its checksum (tokens {low}-{high}: damaged on disk)")
    return buffer.view(spec.dtype).view(high - low, *spec.row_shape)


def _check_metadata(meta: object, layout: KVLayout, tokens: int, token_sha256: str) -> None:
    if not isinstance(meta, dict):
        raise SnapshotInvalid("no metadata")
    want = {"format": FORMAT, "layout": layout.key, "tokens": str(tokens), "token_sha256": token_sha256}
    for key, value in want.items():
        if meta.get(key) != value:
            raise SnapshotInvalid(f"metadata {key}={meta.get(key)!r}, expected {value!r}")


def _checksums(meta: dict, tokens: int, tensors: int):
    """(chunk tokens, an iterator over each tensor's tuple of chunk checksums), validated against the sizes."""
    chunk_text, digits = meta.get("chunk_tokens"), meta.get("xxh3_64")
    if not isinstance(chunk_text, str) or not chunk_text.isdigit() or not isinstance(digits, str):
        raise SnapshotInvalid("no tensor checksums")
    chunk = int(chunk_text)
    if chunk != chunk_tokens_for(tokens, tensors):
        raise SnapshotInvalid(f"checksum chunk of {chunk} tokens, expected {chunk_tokens_for(tokens, tensors)}")
    per_tensor = -(-tokens // chunk)
    if len(digits) != tensors * per_tensor * _DIGITS:
        raise SnapshotInvalid("checksums do not cover the tensors")
    sums = [digits[i:i + _DIGITS] for i in range(0, len(digits), _DIGITS)]
    return chunk, iter(tuple(sums[i:i + per_tensor]) for i in range(0, len(sums), per_tensor))


def _check_tensor(info: object, dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[int, int]:
    if not isinstance(info, dict):
        raise SnapshotInvalid("tensor entry is not an object")
    if DTYPES_BY_NAME.get(info.get("dtype")) != dtype:  # type: ignore[arg-type]
        raise SnapshotInvalid(f"dtype {info.get('dtype')!r}, expected {dtype_name(dtype)}")
    got_shape = info.get("shape")
    if not isinstance(got_shape, list) or [type(d) for d in got_shape] != [int] * len(shape) \
            or tuple(got_shape) != shape:
        raise SnapshotInvalid(f"shape {got_shape!r}, expected {list(shape)}")
    offsets = info.get("data_offsets")
    if not isinstance(offsets, list) or len(offsets) != 2 or [type(o) for o in offsets] != [int, int]:
        raise SnapshotInvalid("bad data_offsets")
    begin, end = offsets
    numel = 1
    for d in shape:
        numel *= d
    if not 0 <= begin <= end or end - begin != numel * dtype.itemsize:
        raise SnapshotInvalid(f"data_offsets {offsets} do not hold a {list(shape)} tensor")
    return begin, end
