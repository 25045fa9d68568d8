"""What checking the torch SSD tier's tensor checksums costs, against the restore it guards (goal: <= 10%).

    .venv/bin/python bench/ssd_checksum.py [--sizes 2048,8192] [--layers 28 --kv-heads 4 --head-dim 128]
                                           [--dtype bfloat16] [--repeats 3]

No model: a KV state of a real model's shape (default: Qwen2.5-7B's, 57 KB per token in bf16) is written
through the real write path (SnapshotStore.commit), then restored through the real read path
(SnapshotStore.restore: header validation, chunked reads, XXH3-64 check of each chunk, copy into the working
buffers), with the file in the OS page cache ("warm": the cheapest restore, so the largest share for the
check) and dropped from it ("cold": what a restart pays). The check's share is the time spent hashing inside
the best checked restore (timed where it runs, on bytes still in the CPU's cache); for comparison, the same
restore with the check taken out (an unchecked reader swapped in), interleaved with the checked one, best of
--repeats each. One JSON line per size and cache state.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench_args import drop_page_cache

from zllm.engine.torch.cache import ssd_format
from zllm.engine.torch.cache.pool import BufferPool
from zllm.engine.torch.cache.ssd_tier import SnapshotJob, SnapshotStore, SsdMatch
from zllm.engine.torch.cache.state import KVLayout, TensorSpec


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2048,8192")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def unchecked_piece(f, header, extent, spec, name, low, high, staging) -> torch.Tensor:
    """ssd_format._checked_piece without the check: what a restore would cost if it trusted the disk."""
    buffer = staging[:(high - low) * extent.row_bytes]
    f.seek(extent.offset + low * extent.row_bytes)
    f.readinto(buffer.numpy().data)
    return buffer.view(spec.dtype).view(high - low, *spec.row_shape)


def timed_restores(store: SnapshotStore, row, dest, pool, cold: bool, repeats: int) -> dict[str, float]:
    """Best restore time, checked and unchecked, interleaved so that the machine's load hits both alike; and
    the time spent hashing inside the best checked restore (the check's own cost, timed where it runs)."""
    times: dict[str, list[float]] = {"checked": [], "unchecked": []}
    hashing: list[float] = []
    checked, checksums = ssd_format._checked_piece, ssd_format.chunk_checksums
    spent = [0.0]

    def timed_checksums(*args):
        started = time.perf_counter()
        try:
            return checksums(*args)
        finally:
            spent[0] += time.perf_counter() - started

    ssd_format.chunk_checksums = timed_checksums
    try:
        for _ in range(repeats):
            for kind, reader in (("checked", checked), ("unchecked", unchecked_piece)):
                ssd_format._checked_piece = reader
                if cold:
                    drop_page_cache(store.directory)
                spent[0] = 0.0
                started = time.perf_counter()
                store.restore(SsdMatch(row, row.length), dest, pool)
                times[kind].append(time.perf_counter() - started)
                if kind == "checked":
                    hashing.append(spent[0])
    finally:
        ssd_format._checked_piece, ssd_format.chunk_checksums = checked, checksums
    best = min(range(repeats), key=lambda i: times["checked"][i])
    return {"checked": times["checked"][best], "unchecked": min(times["unchecked"]), "hashing": hashing[best]}


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    spec = TensorSpec((1, args.kv_heads, args.head_dim), dtype)
    layout = KVLayout(tuple((spec, spec) for _ in range(args.layers)))
    for tokens in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="zllm-bench-ssd-", dir=Path.home()) as tmp:
            store = SnapshotStore(Path(tmp) / "kv", layout, 1 << 40)
            state = tuple(tuple(torch.randn(spec.full_shape(tokens)).to(dtype) for spec in layer)
                          for layer in layout.layers)
            ids = tuple(range(1000, 1000 + tokens))
            row = store.commit(SnapshotJob("bench", "ns", "m", ids, tokens, 1, ((0, state),)))
            del state
            pool = BufferPool(layout, "cpu")
            dest = layout.empty(tokens)
            for cache in ("warm", "cold"):
                best = timed_restores(store, row, dest, pool, cache == "cold", args.repeats)
                print(json.dumps({
                    "tokens": tokens, "page_cache": cache, "bytes": row.nbytes,
                    "restore_s": round(best["checked"], 4), "unchecked_restore_s": round(best["unchecked"], 4),
                    "hashing_s": round(best["hashing"], 4),
                    "check_share_of_restore": round(best["hashing"] / best["checked"], 4),
                    "restore_gb_s": round(row.nbytes / best["checked"] / 1e9, 2),
                    "layout": f"{args.layers}x2x[{args.kv_heads},{args.head_dim}] {args.dtype}"}), flush=True)
            store.close()


if __name__ == "__main__":
    main()
