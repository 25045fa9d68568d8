"""Decode speed of one sequence with other sequences kept in llama.cpp's unified KV pool (issue 26).

    .venv/bin/python bench/kept_sequences.py [MODEL_DIR] [--threads 1] [--tokens 8192] [--others 0,1,4]
        [--new-tokens 32] [--context 32768] [--modes exact,fast]

The suspicion: in a unified pool llama.cpp's attention for one sequence runs over every used cell up to the
pool's highest one (n_kv), masking the cells of other sequences, so a decode step beside K kept 8K-token
sequences costs like one over (K+1) x 8K cells. Measured directly on zllm's engine (load_gguf_model(...).engine,
the daemon's loader, --context 32768 so the pool is the daemon's 64K cells):

    prefill   one --tokens prompt, 512 tokens a step (the scheduler's chunk): its tok/s, and its state exported
    per K     a fresh context; K copies of that state imported (each on cells of its own, like K cached
              conversations), then the decoding sequence's copy on top; --new-tokens greedy single-token steps:
              decode tok/s
    side      (--side-tokens N) before the decoder is imported: the prefill of a new N-token prompt beside the K
              kept sequences (a side request beside a cached conversation)
    dead      (exact mode) K=max copies imported then released: exact mode keeps released cells as dead cells
              (no hole below a used one) until the pool fills, so they stay inside n_kv too

Modes: exact (zllm's default, backend.EXACT_ATTENTION: Q8_0 cells, flash attention) and fast (FAST_ATTENTION:
F16 cells, llama.cpp's choice, what llama-server runs). One JSON line per (mode, K).
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
from zllm.engine.llamacpp.loader import load_gguf_model  # noqa: E402
from zllm.prompt import PromptRenderer  # noqa: E402
from zllm.prompt.tokenizer_files import TokenizerFiles  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = model_parser(__doc__.splitlines()[0], dtype=False)
    parser.add_argument("--tokens", type=int, default=8192, help="each kept sequence's and the decoder's prompt")
    parser.add_argument("--others", default="0,1,4", help="kept sequences beside the decoding one")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--context", type=int, default=32768, help="the daemon's --context-length (pool: 2x, <=64K)")
    parser.add_argument("--modes", default="exact,fast")
    parser.add_argument("--no-dead", action="store_true", help="skip the released (dead cells) case")
    parser.add_argument("--side-tokens", type=int, default=0,
                        help="also the prefill of a new prompt this long beside the K kept ones (a side request)")
    return parser.parse_args()


def load(model_dir: Path, threads: int, context: int, exact: bool):
    return load_gguf_model(model_dir, threads=threads, context_length=context, exact_cache=exact).engine


def prefill(engine, prompt: list[int], chunk: int = 512) -> tuple[object, float]:
    seq = engine.open()
    started = time.perf_counter()
    logits = None
    for start in range(0, len(prompt), chunk):
        logits = engine.step([Row(seq, prompt[start:start + chunk])])[0]
    seq.first_token = int(np.argmax(logits))
    return seq, time.perf_counter() - started


def side_prompt(prompt: list[int], tokens: int) -> list[int]:
    """A prompt sharing nothing with the kept ones: their tokens reversed."""
    return prompt[::-1][:tokens]


def decode_rate(engine, seq, first_token: int, new_tokens: int) -> float:
    token = first_token
    token = int(np.argmax(engine.step([Row(seq, [token])])[0]))  # one untimed step: the graph for n_kv built
    started = time.perf_counter()
    for _ in range(new_tokens):
        token = int(np.argmax(engine.step([Row(seq, [token])])[0]))
    return new_tokens / (time.perf_counter() - started)


def used_cells(engine) -> int:
    import llama_cpp as lc

    return sum(max(lc.llama_memory_seq_pos_max(engine.memory, s) + 1, 0) for s in range(engine.settings.max_sequences))


def run_mode(args, model_dir: Path, prompt: list[int], mode: str) -> None:
    exact = mode == "exact"
    facts = {"bench": "kept_sequences", "mode": mode, "threads": args.threads, "tokens": len(prompt)}
    engine = load(model_dir, args.threads, args.context, exact)
    seq, seconds = prefill(engine, prompt)
    first = seq.first_token
    state = bytes(engine.export_state(seq))
    print(json.dumps({**facts, "figure": "prefill_tok_s", "value": round(len(prompt) / seconds, 1),
                      "seconds": round(seconds, 2), "pool_cells": engine.cells}), flush=True)
    engine.close()
    cases = [(int(k), False) for k in args.others.split(",")]
    if exact and not args.no_dead:
        cases.append((max(k for k, _ in cases), True))
    for others, dead in cases:
        engine = load(model_dir, args.threads, args.context, exact)
        kept = [engine.import_state(bytearray(state), len(prompt)) for _ in range(others)]
        if args.side_tokens and not dead:
            side, seconds = prefill(engine, side_prompt(prompt, args.side_tokens))
            print(json.dumps({**facts, "figure": "side_prefill_tok_s", "others": others, "side_tokens":
                              args.side_tokens, "value": round(args.side_tokens / seconds, 1),
                              "seconds": round(seconds, 2)}), flush=True)
            engine.release(side)
        if dead:
            for other in kept:
                engine.release(other)
        decoder = engine.import_state(bytearray(state), len(prompt))
        rate = decode_rate(engine, decoder, first, args.new_tokens)
        print(json.dumps({**facts, "figure": "decode_tok_s", "others": others, "released": dead,
                          "value": round(rate, 2), "cells_in_sequences": used_cells(engine)}), flush=True)
        engine.close()


def main() -> None:
    args = parse_args()
    model_dir = resolve_model_dir(args).resolve()
    renderer = PromptRenderer(TokenizerFiles.from_dir(model_dir))
    prompt = long_prompt(renderer, args.tokens)
    for mode in args.modes.split(","):
        run_mode(args, model_dir, prompt, mode)


if __name__ == "__main__":
    main()
