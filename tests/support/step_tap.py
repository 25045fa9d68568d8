"""Taps on an engine client's step (engine/contract.py), the same on torch and llama.cpp: see each step's rows
before they run and replace their logits after, so a test can make a random-weight model say what it needs.

    tap = StepTap(client)                       # wraps client.engine.engine.step until tap.remove()
    with forced_opening(tap, prompt_length, token_ids):
        ...                                     # the output opens with token_ids, the model's own logits after
    with opened(tap, client, request, "<tool_call>"):
        ...                                     # the same for one request run alone, its opening as text

A listener is `listener(rows, lengths, outputs) -> outputs`: the step's rows, the tokens each row's sequence
held before the step, and the logits each row got ([vocab], or [n, vocab] for an all_logits row).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from tests.support.speculation import force_rows
from zllm.engine.contract import Row


class StepTap:
    """Wraps the client's engine step: `listeners` see every step's rows and may replace their logits. The
    seam's view is the same whatever computes the logits, so a test holds torch and llama.cpp to one standard."""

    def __init__(self, client):
        self.engine = client.engine.engine
        self.listeners: list = []
        self._original = self.engine.step
        self.engine.step = self._step

    def _step(self, rows):
        lengths = [self.engine.length(row.seq) for row in rows]  # tokens each row held before this step
        outputs = self._original(rows)
        for listener in list(self.listeners):
            outputs = listener(rows, lengths, outputs)
        return outputs

    def remove(self) -> None:
        self.engine.step = self._original


class forced_opening:
    """Context manager: make the output open with `token_ids`, whatever the model's weights; its own logits pass
    through after them. Keyed by the position each kept logits row decides, not by step count, so a k-token
    verify step forces what k decode steps would. `only(row)`: the rows it forces (None: every row; a batch
    needs one per request, each with its own prompt length)."""

    def __init__(self, tap: StepTap, prompt_length: int, token_ids: list[int],
                 only: Callable[[Row], bool] | None = None):
        self.tap, self.prompt_length, self.token_ids, self.only = tap, prompt_length, token_ids, only

    def _force(self, rows, lengths, outputs):
        forced = []
        for row, held, logits in zip(rows, lengths, outputs):
            if self.only is not None and not self.only(row):
                forced.append(logits)
                continue
            n = len(row.token_ids)
            positions = range(held, held + n) if row.all_logits else [held + n - 1]
            rows_logits = logits if row.all_logits else logits[None]  # [kept, vocab]
            targets = [(k, self.token_ids[index]) for k, position in enumerate(positions)
                       if 0 <= (index := position + 1 - self.prompt_length) < len(self.token_ids)]
            if targets:
                rows_logits = force_rows(rows_logits[None], targets)[0]
            forced.append(rows_logits if row.all_logits else rows_logits[0])
        return forced

    def __enter__(self):
        self.tap.listeners.append(self._force)
        return self

    def __exit__(self, *exc):
        self.tap.listeners.remove(self._force)


def opened(tap: StepTap, client, request, text: str) -> forced_opening:
    """`forced_opening` for `request` run alone on `client` (outside an event loop): the output opens with `text`
    as the model's tokenizer spells it."""
    token_ids = client.loaded.tokenizer.encode(text, add_special_tokens=False)
    prompt_length = asyncio.run(asyncio.wait_for(client.count_tokens(request), timeout=60))
    return forced_opening(tap, prompt_length, token_ids)


class LogitMargins:
    """Records, for each row of each step, the top `keep` logits of every position it decides, keyed by request
    id and output index (`position + 1 - prompt length`), so a test can say how close the two candidates were
    where two runs of the same request chose different tokens. `request_of(row)`: (request id, prompt length)."""

    def __init__(self, tap: StepTap, request_of: Callable[[Row], tuple[str, int]], keep: int = 64):
        self.tap, self.request_of, self.keep = tap, request_of, keep
        self.top: dict[tuple[str, int], dict[int, float]] = {}

    def _record(self, rows, lengths, outputs):
        for row, held, logits in zip(rows, lengths, outputs):
            request_id, prompt_length = self.request_of(row)
            n = len(row.token_ids)
            positions = range(held, held + n) if row.all_logits else [held + n - 1]
            values = np.asarray(logits.float().cpu() if hasattr(logits, "cpu") else logits, dtype=np.float32)
            for k, position in enumerate(positions):
                line = values.reshape(len(positions), -1)[k]
                best = np.argpartition(line, -self.keep)[-self.keep:]
                self.top[(request_id, position + 1 - prompt_length)] = {int(t): float(line[t]) for t in best}
        return outputs

    def margin(self, request_id: str, index: int, chosen: int, other: int) -> float:
        """How far `chosen` led `other` at output `index` (inf when `other` was not among the top)."""
        top = self.top[(request_id, index)]
        return top[chosen] - top[other] if other in top else float("inf")

    def __enter__(self):
        self.tap.listeners.append(self._record)
        return self

    def __exit__(self, *exc):
        self.tap.listeners.remove(self._record)
