"""Parking idle kept sequences in host RAM (engine/llamacpp/kv.py) against keeping them in the KV pool (issue 26).

    .venv/bin/python bench/parked_sequences.py [MODEL_DIR] [--threads 1] [--main-tokens 4096] [--others 0,2,8]
        [--side-tokens 400] [--turn-tokens 30] [--context 32768] [--exact]

Through zllm's LlamaKV (the prefix cache's llama.cpp side), on the daemon's loader: a kept main conversation of
--main-tokens and K more kept copies of it (other conversations: K x main-tokens cells), then

    side    a new --side-tokens prompt sharing nothing (a side request): open (parking, if on) + prefill, its tok/s,
            and 8 decode steps' tok/s; then kept, as the cache keeps a finished request
    turn 2  the main conversation hit again with --turn-tokens new tokens: share (restoring it from RAM, if
            parked; parking the side entry) + prefill of the new tokens: the time to its first token

with parking off (park_budget_bytes=0: main's behaviour) and on. One JSON line per (parking, K).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batching import long_prompt  # noqa: E402  (bench/batching.py)
from bench_args import model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)

from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.kv import LlamaKV  # noqa: E402
from zllm.engine.llamacpp.loader import load_gguf_model  # noqa: E402
from zllm.prompt import PromptRenderer  # noqa: E402
from zllm.prompt.tokenizer_files import TokenizerFiles  # noqa: E402

DECODE_STEPS = 8


def parse_args() -> argparse.Namespace:
    parser = model_parser(__doc__.splitlines()[0], dtype=False)
    parser.add_argument("--main-tokens", type=int, default=4096)
    parser.add_argument("--others", default="0,2,8", help="kept copies of the main conversation beside it")
    parser.add_argument("--side-tokens", type=int, default=400)
    parser.add_argument("--turn-tokens", type=int, default=30)
    parser.add_argument("--context", type=int, default=32768, help="the daemon's --context-length (pool: 2x, <=64K)")
    parser.add_argument("--exact", action="store_true", help="exact mode (Q8_0 cells) instead of the daemon default")
    return parser.parse_args()


def prefill(engine, seq, prompt: list[int], chunk: int = 512) -> np.ndarray:
    logits = None
    for start in range(0, len(prompt), chunk):
        logits = engine.step([Row(seq, prompt[start:start + chunk])])[0]
    return logits


def keep(kv: LlamaKV, seq, length: int, name: str):
    handle = kv.keep("ns", tuple(range(length)), seq, seq, name)
    kv.release(seq, kept=True)
    return handle


def run_case(args, engine, state: bytes, prompt: list[int], others: int, park: bool, facts: dict) -> None:
    kv = LlamaKV(engine, layout="bench", spare_sequences=2, park_budget_bytes=(8 << 30) if park else 0)
    n = len(prompt)
    main = keep(kv, engine.import_state(bytearray(state), n), n, "main")
    kept = [keep(kv, engine.import_state(bytearray(state), n), n, f"other{k}") for k in range(others)]
    side_prompt = prompt[::-1][:args.side_tokens]
    started = time.perf_counter()
    side = kv.open(args.side_tokens + DECODE_STEPS)
    opened = time.perf_counter()
    token = int(np.argmax(prefill(engine, side, side_prompt)))
    prefilled = time.perf_counter()
    for _ in range(DECODE_STEPS):
        token = int(np.argmax(engine.step([Row(side, [token])])[0]))
    decoded = time.perf_counter()
    side_kept = keep(kv, side, engine.length(side), "side")
    turn = prompt[:args.turn_tokens][::-1]
    started2 = time.perf_counter()
    running = kv.share(main, n, n + args.turn_tokens + 1)
    shared = time.perf_counter()
    engine.step([Row(running, turn)])
    ttft = time.perf_counter() - started2
    print(json.dumps({**facts, "parking": park, "others": others, "kept_cells": others * n,
                      "side_open_s": round(opened - started, 3),
                      "side_prefill_tok_s": round(args.side_tokens / (prefilled - started), 2),
                      "side_decode_tok_s": round(DECODE_STEPS / (decoded - prefilled), 2),
                      "turn2_ttft_s": round(ttft, 3), "turn2_share_s": round(shared - started2, 3),
                      "parks": kv.parks, "unparks": kv.unparks, "parked_mb": kv.parked_bytes >> 20}), flush=True)
    kv.release(running)
    for handle in [main, side_kept, *kept]:
        kv.drop(handle)
    kv.close()
    engine.pack()  # exact mode buries released cells: the next case starts from an empty pool


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args).resolve()
    prompt = long_prompt(PromptRenderer(TokenizerFiles.from_dir(model_dir)), args.main_tokens)
    engine = load_gguf_model(model_dir, threads=args.threads, context_length=args.context,
                             exact_cache=args.exact).engine
    facts = {"bench": "parked_sequences", "threads": args.threads, "main_tokens": len(prompt),
             "side_tokens": args.side_tokens, "exact": args.exact}
    seq = engine.open()
    started = time.perf_counter()
    prefill(engine, seq, prompt)
    print(json.dumps({**facts, "figure": "main_prefill_s", "value": round(time.perf_counter() - started, 1)}),
          flush=True)
    state = bytes(engine.export_state(seq))
    engine.release(seq)
    for others in map(int, args.others.split(",")):
        for park in (False, True):
            run_case(args, engine, state, prompt, others, park, facts)
    engine.close()


if __name__ == "__main__":
    main()
