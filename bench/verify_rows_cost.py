"""What a speculating llama.cpp server's steps cost against a 1-token decode, step kind by step kind, interleaved.

    .venv/bin/python bench/verify_rows_cost.py [MODEL_DIR] [--threads 1] [--cells 300] [--steps 40] [--rows 2,4,8,13]

One engine (as a speculating server loads it: ContextSettings.uniform_rows), a prompt of --cells tokens, then
every step kind in turn at the same position (cropped back after each), the order reversed every other round so
the machine's noise hits each kind alike; medians:

    plain       a 1-token decode, no pad row (a server without --speculative)
    padded      a 1-token decode beside a pad token (what a speculating server's step costs when its kernels
                differ between 1 row and 2+: backend.ContextSettings.uniform_rows)
    pad_1head   the same with the pad row's logits not computed (the output head on 1 row: timing only, not
                exact): what the output head on the pad row costs
    rowsN       a verify of N tokens of one sequence (a draft of N - 1)

Also prints `agreeing_rows` (engine/llamacpp/row_agreement.py): up to how many rows a verify gives 1-token
decoding's bits without a pad on this model (1: none, the engine pads), over the row counts a load checks or
(`--agreement dense`) every count 2..63. One JSON line:
    {"bench": "verify_rows_cost", "cells": 300, "ms": {...}, "vs_plain": {...}, "agreeing_rows": 1, ...}
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import llama_cpp as lc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import FILLER, model_parser, resolve_model_dir  # noqa: E402  (bench/bench_args.py)

from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.backend import LlamaSequence  # noqa: E402
from zllm.engine.llamacpp.loader import load_gguf_model  # noqa: E402
from zllm.engine.llamacpp.row_agreement import CHECKED_ROWS, agreeing_rows  # noqa: E402


def parse_args():
    parser = model_parser(__doc__.splitlines()[0], dtype=False)
    parser.add_argument("--cells", type=int, default=300, help="prompt tokens before the measured steps")
    parser.add_argument("--steps", type=int, default=40, help="rounds of every step kind")
    parser.add_argument("--rows", default="2,4,8,13", help="verify sizes to time")
    parser.add_argument("--agreement", choices=("checked", "dense"), default="checked",
                        help="agreeing_rows over the counts a load checks, or over every count 2..63")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    loaded = load_gguf_model(resolve_model_dir(args), threads=args.threads, exact_cache=False, uniform_rows=True,
                             context_length=max(args.cells + 128, 4096))
    engine, tokenizer = loaded.engine, loaded.tokenizer
    speculating = engine.settings
    plain = dataclasses.replace(speculating, uniform_rows=False)
    pads = engine.step_rows == 2  # as the speculating server runs
    engine.settings = plain
    agree = agreeing_rows(engine, CHECKED_ROWS if args.agreement == "checked" else range(2, 64))
    prompt = (tokenizer.encode(FILLER * (args.cells // 30 + 1), add_special_tokens=False))[:args.cells]
    seq = engine.open()
    engine.step([Row(seq, prompt)])
    held = seq.length
    pad = LlamaSequence(engine._pad_id if engine._pad_id is not None else 0)  # the pad tokens' sequence

    def run(kind: str) -> float:
        token = prompt[-1]
        engine.settings = plain if kind in ("plain", "pad_1head") else speculating
        start = time.perf_counter()
        if kind == "pad_1head":
            engine._decode([(seq, token, seq.length, True), (pad, token, 0, False)])
            seq.length += 1
            lc.llama_memory_seq_rm(engine.memory, pad.seq_id, -1, -1)
        elif kind.startswith("rows"):
            engine.step([Row(seq, [token] * int(kind[4:]), all_logits=True)])
        else:
            engine.step([Row(seq, [token])])
        seconds = time.perf_counter() - start
        engine.crop(seq, held)
        return seconds

    kinds = ["plain", "padded", "pad_1head", *(f"rows{n}" for n in args.rows.split(","))]
    if not pads:
        kinds.remove("padded")  # nothing pads: a speculating step with no draft IS the plain step
        kinds.remove("pad_1head")
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for kind in kinds:  # warm-up
        run(kind)
    for round_ in range(args.steps):
        for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
            times[kind].append(run(kind))
    median = {kind: float(np.median(values)) for kind, values in times.items()}
    print(json.dumps({
        "bench": "verify_rows_cost", "cells": held, "threads": args.threads, "steps": args.steps,
        "ms": {kind: round(value * 1e3, 2) for kind, value in median.items()},
        "vs_plain": {kind: round(median["plain"] / value, 3) for kind, value in median.items()},
        "agreeing_rows": agree, "pads": pads, "quantization": loaded.quantization}), flush=True)


if __name__ == "__main__":
    main()
