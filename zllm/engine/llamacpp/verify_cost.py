"""What one more verified row costs, measured at load: speculation's gate (runtime/speculative.py) drafts only
where the tokens a draft is expected to add outweigh its rows.

A CPU's verify is compute-bound, and how well rows batch depends on the weights' kernel: F16 weights (tinyBLAS,
a padded 2-row step) add ~0.2 of a step per row, Q4_1 (vec_dot, one row at a time) ~0.6
(bench/verify_rows_cost.py, the default model at 1 thread). So the cost is measured, not looked up: the fastest
of a few steps of `step_rows` tokens against the fastest of a few verifies of VERIFY_ROWS, on one thread (as the
row agreement check: a decode with more threads on the loading thread leaves an OpenMP team behind).

That measure is taken over 64 cells, where the weights' products are nearly all of a row's cost. Over a long
conversation each verified row also attends to every cell, in the per-cell kernel a speculating server keeps
(exactness: backend.py's EXACT_ATTENTION comment), and that part does not batch: at 8.5K cells it is about twice
the products' cost on the default model (the session benchmark's echo turn, where 12-token drafts gained nothing).
`attention_cell_cost` estimates it per cell, from the model's shape: 4 * layers * width FLOPs per cell and row
against 2 * parameters per token (a row's products), the same kernel family's rate assumed for both.
"""

from __future__ import annotations

import time

import llama_cpp as lc

from zllm.engine.contract import Row

VERIFY_ROWS = 9  # the wide side: long enough that the step's fixed costs weigh little (a row costs ~linear)
REPEATS = 3  # fastest of: a loaded machine only ever makes a step slower


def verify_row_cost(engine) -> float:
    """A verified row's cost past the step's own `step_rows`, in steps (0: rows are free, e.g. on a GPU)."""
    rows = min(VERIFY_ROWS, engine.verify_rows)
    if rows <= engine.step_rows:
        return 0.0
    prompt = [(i * 7919) % min(engine.vocab_size, 5000) for i in range(64)]
    seq = engine.open()
    try:
        engine.step([Row(seq, prompt)])
        step = _fastest(engine, seq, prompt[:1])  # a 1-token step, padded as the engine pads it
        verify = _fastest(engine, seq, prompt[:rows])
    finally:
        engine.release(seq)
    return max(verify / step - 1, 0.0) / (rows - engine.step_rows)


def _fastest(engine, seq, tokens: list[int]) -> float:
    held = engine.length(seq)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        engine.step([Row(seq, tokens, all_logits=len(tokens) > 1)])
        best = min(best, time.perf_counter() - start)
        engine.crop(seq, held)
    return best


def attention_cell_cost(engine) -> float:
    """One query row's attention over one cell, in 1-token steps' product cost (runtime's CostGate scales a row's
    cost by the sequence's length with it)."""
    model = engine.model
    parameters = max(lc.llama_model_n_params(model), 1)
    return 2.0 * lc.llama_model_n_layer(model) * lc.llama_model_n_embd(model) / parameters
