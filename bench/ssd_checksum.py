"""What checking the SSD store's chunk checksums costs, against the torch restore it guards (goal: <= 10%).

    .venv/bin/python bench/ssd_checksum.py [--sizes 2048,8192] [--layers 28 --kv-heads 4 --head-dim 128]
                                           [--dtype bfloat16] [--repeats 3]

No model: a KV state of a real model's shape (default: Qwen2.5-7B's, 57 KB per token in bf16) is written
through the real write path (the torch backend's export, SnapshotStore.commit), then restored through the real
read path (SnapshotStore.read: frame validation, the XXH3-64 check of each chunk; TorchKV.load into working
buffers), with the file in the OS page cache ("warm": the cheapest restore, so the largest share for the check)
and dropped from it ("cold": what a restart pays). The check's share is the time XXH3 takes over the same bytes
(already in memory) against the best restore of --repeats. One JSON line per size and cache state.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench_args import drop_page_cache

from zllm.engine.torch.cache.kv import TorchKV, token_major_bytes
from zllm.engine.torch.cache.state import KVLayout, TensorSpec
from zllm.kvcache.snapshot_frame import chunk_checksums
from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotMatch, SnapshotStore


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


def timed_restore(store: SnapshotStore, kv: TorchKV, row, dest, cold: bool) -> float:
    if cold:
        drop_page_cache(store.blobs)
    started = time.perf_counter()
    payload, first, _ = store.read(SnapshotMatch(row, row.length), 0)
    kv.load(dest, payload, first, row.length, row.length)
    return time.perf_counter() - started


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    spec = TensorSpec((1, args.kv_heads, args.head_dim), dtype)
    layout = KVLayout(tuple((spec, spec) for _ in range(args.layers)))
    kv = TorchKV(layout, "cpu")
    for tokens in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="zllm-bench-ssd-", dir=Path.home()) as tmp:
            store = SnapshotStore(Path(tmp) / "kv", layout.key, 1 << 40, token_bytes=layout.bytes_per_token)
            state = tuple(tuple(torch.randn(spec.full_shape(tokens)).to(dtype) for spec in layer)
                          for layer in layout.layers)
            ids = tuple(range(1000, 1000 + tokens))
            row = store.commit(SnapshotJob("bench", "ns", "m", ids, tokens, 1,
                                           partial(token_major_bytes, (state,), tokens)))
            payload = token_major_bytes((state,), tokens)
            del state
            started = time.perf_counter()
            chunk_checksums(payload)
            hashing = time.perf_counter() - started
            dest = layout.empty(tokens)
            for cache in ("warm", "cold"):
                best = min(timed_restore(store, kv, row, dest, cache == "cold") for _ in range(args.repeats))
                print(json.dumps({
                    "tokens": tokens, "page_cache": cache, "bytes": row.nbytes, "restore_s": round(best, 4),
                    "hashing_s": round(hashing, 4), "check_share_of_restore": round(hashing / best, 4),
                    "restore_gb_s": round(row.nbytes / best / 1e9, 2),
                    "layout": f"{args.layers}x2x[{args.kv_heads},{args.head_dim}] {args.dtype}"}), flush=True)
            store.close()


if __name__ == "__main__":
    main()
