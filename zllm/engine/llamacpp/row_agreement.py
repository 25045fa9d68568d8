"""Whether verifying a draft in one decode gives the bits decoding it token by token gives, without a pad row.

ggml picks a CPU kernel by a product's shape and the weights' type, and kernels sum in different orders:
- F16 / BF16 / F32 weights: a 1-row product takes vec_dot, 2+ rows llamafile's tinyBLAS (compiled in; no
  runtime switch: the CPU backend's `use_ref` does not reach it): every verify row differs in its last bits.
- Q4_1: vec_dot at any row count; Q8_0 (and Q5_0): tinyBLAS from 2 rows, but its kernel for them sums as
  vec_dot does. Measured on SmolLM2-135M: 2..13 rows agree for its Q4_1 file (a Q8_0 output head) and for
  the F16 file re-quantized to Q8_0.
- K-quants: repacked on AVX2 (a 4-row gemm beside a 1-row gemv) and ggml's tiled kernel from 8 rows. Measured
  on a Q4_K_M file: 2..7 rows agree over Q8_0 cells, 2..3 over F16 cells.
- attention over F16 cells: one query row over 512+ cells takes the KV-split kernel, split by thread at
  n_kv / threads: at 1 thread one split, the per-cell kernel's sums; at 2+ threads other sums.
So the answer is measured, not looked up: `agreeing_rows` decodes a few tokens one by one on a scratch sequence
over 512+ cells, then verifies them in one decode at each row count, and compares the logits bit for bit.
A kernel choice is by shape, not by value: different kernels give different bits on almost any input, so one
random prompt finds them. The engine pads 1-token decodes only when fewer than 2 rows agree
(backend.ContextSettings.uniform_rows), and caps drafts at the rows that do (`LlamaCppEngine.verify_rows`).

Which row counts: every one from 2 to 9 (where the kernels above change: K-quants part at 4 and 8 rows), then 12
and 16 (a quantized model's verified row costs ~0.6 of a step on a CPU, so the cost gate of runtime/speculative.py
never drafts much past 10 tokens there; each count checked costs load time). Between two checked counts nothing
new is picked: tinyBLAS sums each output element in one accumulator over k in order whatever its tile (the row
count's remainder picks a tile, never a sum order), vec_dot is per row, and F16 cells' attention changes kernel
at 64 rows only (`bench/verify_rows_cost.py --agreement dense` checks every count 2..63: the default model's Q4_1
file and its F16 file re-quantized to Q8_0 agree at every one, 1 thread, F16 cells). Over 512+ F16 cells
only the 1-token side changes kernel (one query row's KV-split), so 2 rows show it.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp as lc
import numpy as np

from zllm.engine.contract import Row

SPLIT_ATTENTION_CELLS = 512  # ggml's KV-split attention for one query row over F16/F32 cells starts here
# the row counts a load checks (module docstring)
CHECKED_ROWS = (*range(2, 10), 12, 16)


def agreeing_rows(engine, counts: Sequence[int] = CHECKED_ROWS) -> int:
    """The largest of `counts` (ascending, from 2) such that a verify of it and of every smaller one gives, row by
    row, the logits 1-token decoding gives (1: none does). `engine` decodes unpadded here; run on one thread (the
    caller's). Checked over 64 cells first (F16 weights differ there already: a cheap answer), then over 512+
    where the cells are F16 or F32 — one query row's KV-split attention, which only the 1-token side takes, so
    there 2 rows show it."""
    rows = _agreeing_rows_after(engine, 64, counts)
    if rows < 2 or engine.settings.kv_type not in (lc.GGML_TYPE_F16, lc.GGML_TYPE_F32):
        return rows
    return rows if _agreeing_rows_after(engine, min(SPLIT_ATTENTION_CELLS + 64, engine.cells // 2), (2,)) == 2 else 1


def _agreeing_rows_after(engine, prompt_length: int, counts: Sequence[int]) -> int:
    prompt = [(i * 7919) % min(engine.vocab_size, 5000) for i in range(prompt_length)]
    seq = engine.open()
    agreed = 1
    try:
        logits = engine.step([Row(seq, prompt)])[0]
        tokens, alone = [], []  # alone[i]: the logits after tokens[i], decoded one by one in `seq`
        for rows in counts:
            while len(tokens) < rows + 1:  # decoded as far as this verify needs (F16 weights stop at 2 rows)
                tokens.append(int(np.argmax(logits)))
                logits = engine.step([Row(seq, [tokens[-1]])])[0]
                alone.append(logits)
            # a verify of tokens[1:1 + rows] after tokens[0] must give alone[1:1 + rows]; in a sequence sharing
            # seq's first cells, so seq's own cells stay those 1-token decoding wrote
            verify = engine.share(seq, prompt_length + 1)
            try:
                verified = engine.step([Row(verify, tokens[1:1 + rows], all_logits=True)])[0]
            finally:
                engine.release(verify)
            if not np.array_equal(verified, np.stack(alone[1:1 + rows])):
                return agreed
            agreed = rows
        return agreed
    finally:
        engine.release(seq)
