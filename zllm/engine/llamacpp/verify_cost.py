"""What one more verified row costs, measured at load: speculation's gate (runtime/speculative.py) drafts only
where the tokens a draft is expected to add outweigh its rows.

A CPU's verify is compute-bound, and how well rows batch depends on the weights' kernel: F16 weights (tinyBLAS,
a padded 2-row step) add ~0.2 of a step per row, Q4_1 (vec_dot, one row at a time) ~0.6
(bench/verify_rows_cost.py, the default model at 1 thread). So the cost is measured, not looked up: the fastest
of a few steps of `step_rows` tokens against the fastest of a few verifies of VERIFY_ROWS, on one thread (as the
row agreement check: a decode with more threads on the loading thread leaves an OpenMP team behind).
"""

from __future__ import annotations

import time

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
