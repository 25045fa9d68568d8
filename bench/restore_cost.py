"""The fixed and per-token parts of an SSD restore and of a short prefill on llama.cpp (kvcache/cost.py's model).

    .venv/bin/python bench/restore_cost.py [MODEL_DIR] [--threads 1] [--sizes 16,64,256,1024,4096] [--repeats 5]

Restore of N tokens, timed as an SSD hit is (kvcache/prefix_cache.py: `read_ssd` + `complete_ssd`): read and
verify the snapshot (its pages dropped from the OS cache first, or warm with --warm), load it into a new sequence,
crop it; a prefill of k tokens beside an N-token sequence (k = 1..64: what a restore of k more tokens would spare).
Wall and this thread's CPU seconds, the median of --repeats; then least-squares fits a + b*N (restore) and
a + b*k (prefill), printed as JSON lines.
"""

from __future__ import annotations

import json
import shutil
import statistics
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


def timed(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - wall, time.thread_time() - cpu


def prefill(engine, seq, tokens: list[int]) -> None:
    for start in range(0, len(tokens), CHUNK):
        engine.step([Row(seq, tokens[start:start + CHUNK])])


def restore_once(engine, store, row, scratch: Path, warm: bool) -> tuple[float, float]:
    if not warm:
        drop_page_cache(scratch)
    held = []

    def restore():
        payload = store.read(SnapshotMatch(row, row.length), 0).payload
        seq = engine.import_state(payload, row.length)
        engine.crop(seq, row.length - 1)
        held.append(seq)
    result = timed(restore)
    engine.release(held[0])
    return result


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares a + b*x."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main() -> None:
    parser = model_parser(__doc__, dtype=False)
    parser.add_argument("--sizes", default="16,64,256,1024,4096")
    parser.add_argument("--prefills", default="1,2,4,8,16,32,64")
    parser.add_argument("--prefix", type=int, default=384, help="the sequence the short prefills continue")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warm", action="store_true", help="restore from the OS page cache")
    args = parser.parse_args()
    model_dir = resolve_model_dir(args)
    sizes = [int(size) for size in args.sizes.split(",")]
    loaded = load_gguf_model(model_dir, threads=args.threads, context_length=max(sizes) * 2 + 256,
                             exact_cache=False)
    engine, scratch = loaded.engine, Path(tempfile.mkdtemp(prefix="zllm-bench-restore-cost-"))
    vocab = engine.vocab_size - 200
    restore_wall, restore_cpu = [], []
    try:
        store = SnapshotStore(scratch, "bench", 1 << 40)
        for size in sizes:
            tokens = [(i * 7919) % vocab + 100 for i in range(size)]
            seq = engine.open()
            prefill(engine, seq, tokens)
            state = engine.export_state(seq)
            row = store.commit(SnapshotJob(f"s{size}", "bench", "m", tuple(tokens), size, 1, lambda: state))
            engine.release(seq)
            runs = [restore_once(engine, store, row, scratch, args.warm) for _ in range(args.repeats)]
            wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
            restore_wall.append((size, wall))
            restore_cpu.append((size, cpu))
            print(json.dumps({"bench": "restore_cost", "restore_tokens": size, "bytes": row.nbytes,
                              "wall_s": round(wall, 5), "cpu_s": round(cpu, 5), "warm": args.warm}), flush=True)
        store.close()
        prefill_wall, prefill_cpu = [], []
        base = [(i * 104729) % vocab + 100 for i in range(args.prefix)]
        for k in map(int, args.prefills.split(",")):
            runs = []
            for _ in range(args.repeats):
                seq = engine.open()
                prefill(engine, seq, base)
                runs.append(timed(lambda: prefill(engine, seq, base[:k])))
                engine.release(seq)
            wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
            prefill_wall.append((k, wall))
            prefill_cpu.append((k, cpu))
            print(json.dumps({"bench": "restore_cost", "prefill_tokens": k, "after": args.prefix,
                              "wall_s": round(wall, 5), "cpu_s": round(cpu, 5)}), flush=True)
        token_bytes = engine.bytes_per_token
        for name, points in (("restore_wall", restore_wall), ("restore_cpu", restore_cpu),
                             ("prefill_wall", prefill_wall), ("prefill_cpu", prefill_cpu)):
            a, b = fit(points)
            per = {"s_per_byte": b / token_bytes} if name.startswith("restore") else {}
            print(json.dumps({"bench": "restore_cost", "fit": name, "fixed_s": round(a, 5), "s_per_token": b,
                              **per, "threads": args.threads, "model": model_dir.name}), flush=True)
    finally:
        engine.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
