"""Snapshot blob files: safetensors, written by us, read as untrusted input.

    [u64 LE header_len][header JSON, space-padded to 8 bytes][tensor data, back to back, no gaps]

    header = {"__metadata__": {"format": "zllm-kv-1", "layout": "<KVLayout.key>", "tokens": "600",
                               "token_sha256": "<sha256 of the blob's own token ids, int32 LE>"},
              "0.0": {"dtype": "F32", "shape": [600, 1, 2, 16], "data_offsets": [0, 76800]},   # layer 0, k
              "0.1": {...}, "1.0": {...}, ...}                                                  # layer 0, v; ...

Tensors are stored **token-major** (`[tokens, *row_shape]`, the in-memory `[1, kv_heads, tokens, head_dim]`
with the token axis moved to the front), so the first `n` tokens of a tensor are one contiguous byte range:
a restore of a prefix reads only that prefix.

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

from zllm.kvcache.ssd_index import SnapshotInvalid
from zllm.kvcache.state import DTYPES_BY_NAME, KVLayout, KVState, dtype_name, slice_state

FORMAT = "zllm-kv-1"
MAX_HEADER_BYTES = 1 << 20  # 1 MiB: thousands of layers' entries; anything larger is not ours
_ALIGN = 8


@dataclass(frozen=True)
class TensorExtent:
    offset: int  # absolute file offset of the tensor's first byte
    nbytes: int
    row_bytes: int  # bytes per token


@dataclass(frozen=True)
class BlobHeader:
    tokens: int
    extents: tuple[tuple[TensorExtent, ...], ...]  # per layer, per tensor


def tensor_name(layer: int, index: int) -> str:
    return f"{layer}.{index}"


def write_blob(path: Path, state: KVState, layout: KVLayout, token_sha256: str) -> int:
    """Write `state` (tokens on axis -2) to `path` and fsync it; returns the file size.

    The caller writes to a temporary name and renames after this returns (the commit protocol lives in
    ssd_tier.py); this function only guarantees the bytes are on disk when it returns.
    """
    tokens = layout.check(state)
    rows = [[t.movedim(-2, 0).contiguous().cpu() for t in layer] for layer in state]  # [tokens, *row_shape]
    header: dict[str, object] = {"__metadata__": {
        "format": FORMAT, "layout": layout.key, "tokens": str(tokens), "token_sha256": token_sha256}}
    offset = 0
    for i, layer in enumerate(rows):
        for j, t in enumerate(layer):
            header[tensor_name(i, j)] = {"dtype": dtype_name(t.dtype), "shape": list(t.shape),
                                         "data_offsets": [offset, offset + t.nbytes]}
            offset += t.nbytes
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
    _check_metadata(header.pop("__metadata__", None), layout, tokens, token_sha256)
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
            layer_extents.append(TensorExtent(data_start + begin, end - begin, spec.row_bytes))
        extents.append(tuple(layer_extents))
    if data_start + cursor != file_size:
        raise SnapshotInvalid(f"file is {file_size} bytes, header accounts for {data_start + cursor}")
    return BlobHeader(tokens, tuple(extents))


def read_range_into(f, header: BlobHeader, first: int, count: int, dest: KVState, dest_start: int,
                    layout: KVLayout, staging: torch.Tensor) -> None:
    """Copy the blob's tokens [first, first+count) into dest[..., dest_start:dest_start+count, :].

    Token-major storage makes that one contiguous read per tensor. `staging` is a flat uint8 buffer large
    enough for one tensor's `count` tokens.
    """
    assert 0 <= first and 0 < count and first + count <= header.tokens
    for layer_index, (layer_extents, specs) in enumerate(zip(header.extents, layout.layers)):
        for tensor_index, (extent, spec) in enumerate(zip(layer_extents, specs)):
            nbytes = count * extent.row_bytes
            buffer = staging[:nbytes]
            f.seek(extent.offset + first * extent.row_bytes)
            if f.readinto(buffer.numpy().data) != nbytes:
                raise SnapshotInvalid("blob ended early")  # the file changed under us since validation
            rows = buffer.view(spec.dtype).view(count, *spec.row_shape)  # [count, *row_shape]
            target = slice_state(dest, dest_start, dest_start + count)[layer_index][tensor_index]
            # synchronous: the staging buffer is reused for the next tensor right away
            target.copy_(rows.movedim(0, -2))


def _check_metadata(meta: object, layout: KVLayout, tokens: int, token_sha256: str) -> None:
    if not isinstance(meta, dict):
        raise SnapshotInvalid("no metadata")
    want = {"format": FORMAT, "layout": layout.key, "tokens": str(tokens), "token_sha256": token_sha256}
    for key, value in want.items():
        if meta.get(key) != value:
            raise SnapshotInvalid(f"metadata {key}={meta.get(key)!r}, expected {value!r}")


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
