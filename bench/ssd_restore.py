"""SSD restore vs recompute on the llama.cpp backend, from 1K to 8K tokens (design/PERF.md P2: "never > 1.0").

    .venv/bin/python bench/ssd_restore.py [MODEL_DIR] [--threads 2] [--sizes 1024,2048,4096,8192]

Per size, side by side in one run: recompute = a cold prefill of N tokens in the engine loop's 512-token
chunks; restore = what an SSD hit does instead — read the snapshot from disk (its pages dropped from the OS
cache first) and verify it, load it into a new sequence, crop it — then both feed the same last token, whose
logits are what a first output token needs. One JSON line per size: ratio = restore / recompute.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import drop_page_cache, model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)

from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.loader import load_gguf_model  # noqa: E402
from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotMatch, SnapshotStore  # noqa: E402

CHUNK = 512


def recompute(engine, tokens: list[int]) -> tuple[float, object]:
    seq, started = engine.open(), time.perf_counter()
    for start in range(0, len(tokens), CHUNK):
        engine.step([Row(seq, tokens[start:start + CHUNK])])
    return time.perf_counter() - started, seq


def restore(engine, store: SnapshotStore, row, length: int, last: int) -> float:
    started = time.perf_counter()
    payload = store.read(SnapshotMatch(row, length), 0).payload
    seq = engine.import_state(payload, row.length)
    engine.crop(seq, length)
    engine.step([Row(seq, [last])])
    seconds = time.perf_counter() - started
    engine.release(seq)
    return seconds


def main() -> None:
    parser = model_parser(__doc__, dtype=False)
    parser.add_argument("--sizes", default="1024,2048,4096,8192")
    args = parser.parse_args()
    model_dir = resolve_model_dir(args)
    sizes = [int(size) for size in args.sizes.split(",")]
    loaded = load_gguf_model(model_dir, threads=args.threads, context_length=max(sizes) + 64,
                             exact_cache=False)  # the daemon's default
    engine, scratch = loaded.engine, Path(tempfile.mkdtemp(prefix="zllm-bench-ssd-"))
    try:
        store = SnapshotStore(scratch, "bench", 1 << 40)
        for size in sizes:
            tokens = [(i * 7919) % (engine.vocab_size - 200) + 100 for i in range(size)]
            cold_s, seq = recompute(engine, tokens)
            state = engine.export_state(seq)
            row = store.commit(SnapshotJob(f"s{size}", "bench", "m", tuple(tokens), size, 1, lambda: state))
            engine.release(seq)
            drop_page_cache(scratch)
            restore_s = restore(engine, store, row, size - 1, tokens[-1])
            print(json.dumps({"bench": "ssd_restore", "tokens": size, "recompute_s": round(cold_s, 3),
                              "restore_s": round(restore_s, 3), "ratio": round(restore_s / cold_s, 4),
                              "snapshot_mb": round(row.nbytes / 1e6, 1), "threads": args.threads,
                              "backend": "llamacpp", "model": model_dir.name, "quantization": loaded.quantization}),
                  flush=True)
        store.close()
    finally:
        engine.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
