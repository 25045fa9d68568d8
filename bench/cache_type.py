"""`--cache-type f16` vs `q8_0` on the llama.cpp backend, side by side in one run (issue 26).

    .venv/bin/python bench/cache_type.py [MODEL_DIR] [--threads 1] [--tokens 2048] [--decode 32]
        [--cache-budget-mb 512] [--rounds 1] [--types f16,q8_0]

Both pools are loaded at once, as the daemon loads them (engine/llamacpp/loader.py, not exact), and measured in
turn, round by round. Per type, one JSON line: KV bytes a token (measured, and the loader's estimate), the
tokens the `--cache-budget-mb` pool holds; a cold prefill of --tokens tokens in the runtime's 512-token chunks
(tok/s) and --decode greedy one-token steps after it (tok/s); the sequence's SSD snapshot (MB, through the real
SnapshotStore) and a restore of it after its pages are dropped from the OS cache (read + verify + import + crop
+ the last token), with restore / prefill. And restore ≡ full prefill: `hit_dlogit` = max |Δlogit| of the
last token recomputed on the kept cells (a device hit) against the cold prefill's, `restore_dlogit` = the SSD
restore's against the device hit's (the same pieces: the same cells, imported elsewhere in the pool), each with
`_rel` (over the largest |logit|) and whether the argmax agrees.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from bench_args import FILLER, drop_page_cache, model_parser, resolve_model_dir  # noqa: E402

from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.loader import load_gguf_model  # noqa: E402
from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotMatch, SnapshotStore  # noqa: E402
from zllm.model_files import GGUF_FILE  # noqa: E402

CHUNK = 512


def prompt_tokens(tokenizer, n: int) -> list[int]:
    """`n` tokens of numbered filler lines (varied enough that greedy decoding does not just loop)."""
    text = "".join(f"# line {i}\n{FILLER}" for i in range(n // 20 + 1))
    return tokenizer.encode(text, add_special_tokens=False)[:n]


def gap(a: np.ndarray, b: np.ndarray) -> dict:
    worst = float(np.max(np.abs(a - b)))
    return {"dlogit": round(worst, 5), "rel": round(worst / float(np.max(np.abs(b))), 7),
            "argmax_agrees": int(a.argmax()) == int(b.argmax())}


def measure(loaded, tokens: list[int], decode: int, scratch: Path) -> dict:
    engine, n = loaded.engine, len(tokens)
    seq, started = engine.open(), time.perf_counter()
    for start in range(0, n, CHUNK):
        (cold,) = engine.step([Row(seq, tokens[start:start + CHUNK])])
    prefill_s = time.perf_counter() - started
    state = bytes(engine.export_state(seq))  # the n-token sequence, as the SSD writer exports it

    started, logits = time.perf_counter(), cold
    for _ in range(decode):
        (logits,) = engine.step([Row(seq, [int(logits.argmax())])])
    decode_s = time.perf_counter() - started

    engine.crop(seq, n - 1)  # a device hit on the same prompt: all but the last token kept, the last recomputed
    (hit,) = engine.step([Row(seq, tokens[-1:])])

    directory = Path(tempfile.mkdtemp(prefix=f"{loaded.kv_cache_type}-", dir=scratch))  # a store per run
    store = SnapshotStore(directory, "bench", 1 << 40)
    row = store.commit(SnapshotJob("s", "bench", "m", tuple(tokens), n, 1, lambda: state))
    drop_page_cache(directory)
    started = time.perf_counter()
    payload = store.read(SnapshotMatch(row, n - 1), 0).payload
    restored = engine.import_state(payload, row.length)  # beside `seq`'s cells: another place in the pool
    engine.crop(restored, n - 1)
    (restore,) = engine.step([Row(restored, tokens[-1:])])
    restore_s = time.perf_counter() - started
    store.close()
    shutil.rmtree(directory)
    engine.release(restored)
    engine.release(seq)
    hit_gap, restore_gap = gap(hit, cold), gap(restore, hit)
    return {"prefill_tok_s": round(n / prefill_s, 2), "decode_tok_s": round(decode / decode_s, 2) if decode else None,
            "snapshot_mb": round(row.nbytes / 1e6, 2), "restore_s": round(restore_s, 3),
            "restore_over_prefill": round(restore_s / prefill_s, 4),
            "hit_dlogit": hit_gap["dlogit"], "hit_dlogit_rel": hit_gap["rel"], "hit_argmax": hit_gap["argmax_agrees"],
            "restore_dlogit": restore_gap["dlogit"], "restore_dlogit_rel": restore_gap["rel"],
            "restore_argmax": restore_gap["argmax_agrees"]}


def main() -> None:
    parser = model_parser(__doc__, dtype=False)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--cache-budget-mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--types", default="f16,q8_0")
    args = parser.parse_args()
    model_dir = resolve_model_dir(args)
    types = args.types.split(",")
    pools = {kind: load_gguf_model(model_dir, threads=args.threads, cache_budget_mb=args.cache_budget_mb,
                                   exact_cache=False, cache_type=kind) for kind in types}
    scratch = Path(tempfile.mkdtemp(prefix="zllm-bench-cache-type-"))
    try:
        tokens = prompt_tokens(pools[types[0]].tokenizer, args.tokens)
        for round_ in range(args.rounds):
            for kind, loaded in pools.items():
                engine = loaded.engine
                figures = measure(loaded, tokens, args.decode, scratch)
                print(json.dumps({
                    "bench": "cache_type", "cache_type": kind, "round": round_, "tokens": len(tokens),
                    "bytes_per_token": engine.bytes_per_token,
                    "estimated_bytes_per_token": engine.estimate_bytes_per_token(str(model_dir / GGUF_FILE),
                                                                                 engine.settings.kv_type),
                    "cache_budget_mb": args.cache_budget_mb, "tokens_held": engine.cells,
                    "kv_mb": round(engine.kv_bytes / 2**20, 1), **figures, "threads": args.threads,
                    "model": model_dir.name, "quantization": loaded.quantization}), flush=True)
    finally:
        for loaded in pools.values():
            loaded.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
