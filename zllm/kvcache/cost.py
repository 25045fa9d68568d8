"""Restore-vs-recompute estimate: is reading a snapshot from SSD faster than prefilling its tokens again?

On a CPU a restore is far cheaper than recompute; on a fast GPU a short prefix can be quicker to recompute than
to read (SGLang measured a file-tier hit slower than recompute at 8K tokens on H-class GPUs). So both rates
are measured as the daemon runs — prefill seconds per token from real prefills, restore seconds per byte from
real restores — as exponential moving averages, and persisted per (model layout, device) so a restart starts
from the last estimate. Until a rate has been measured, restores are assumed to pay (they do on every
machine measured so far for long prefixes, and a first restore is what measures them).

A restore also costs something whatever its size (opening the file, its header and index checks, the engine's
load call), which a per-byte rate alone spreads over the bytes: a restore that spares a few tokens of prefill then
looks free. So a restore's time is fitted as fixed + bytes x rate, by least squares over recent restores
(exponentially weighted like the rates), with one light pseudo-observation of a restore of nothing taking
RESTORE_FIXED_S: until restores of different sizes are seen the fixed part stays near that measured default and
the rate takes the rest. bench/restore_cost.py measures both parts on llama.cpp: SmolLM2-135M F16, one thread, a
16-token restore (370 KB) takes 1.2 ms in all, 4,096 tokens (94 MB) 0.22 s; a prefill of 16 tokens 0.15 s of CPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

SMOOTHING = 0.3  # weight of the newest observation
MIN_OBSERVED_TOKENS = 16  # shorter prefills are dominated by fixed overhead, not per-token cost
SAFETY = 1.25  # restore must beat recompute by this factor when both are measured (reads vary more)
RESTORE_FIXED_S = 0.001  # a restore's cost whatever its size, until measured (the 16-token restore above: 1.2 ms)
PRIOR_WEIGHT = 0.001  # the pseudo-observation's weight (a real restore weighs 1): it decides only what the data cannot


@dataclass
class CostModel:
    prefill_s_per_token: float | None = None
    restore_s_per_byte: float | None = None
    restore_s_fixed: float = RESTORE_FIXED_S  # per-restore overhead (opening files, validating headers, loading)
    # exponentially weighted sums over observed restores (weight, bytes, seconds, bytes², bytes x seconds)
    restore_sums: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_OBSERVED_TOKENS and seconds > 0:
            self.prefill_s_per_token = _ema(self.prefill_s_per_token, seconds / tokens)

    def observe_restore(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            keep = 1 - SMOOTHING
            w, x, y, xx, xy = (keep * total for total in self.restore_sums)
            self.restore_sums = (w + 1, x + nbytes, y + seconds, xx + nbytes * nbytes, xy + nbytes * seconds)
            self.restore_s_fixed, self.restore_s_per_byte = fit_restore(self.restore_sums)

    def restore_pays(self, tokens: int, nbytes: int) -> bool:
        if self.prefill_s_per_token is None or self.restore_s_per_byte is None:
            return True
        restore = self.restore_s_fixed + nbytes * self.restore_s_per_byte
        return restore * SAFETY < tokens * self.prefill_s_per_token

    def to_json(self) -> str:
        return json.dumps({"prefill_s_per_token": self.prefill_s_per_token,
                           "restore_s_per_byte": self.restore_s_per_byte, "restore_s_fixed": self.restore_s_fixed,
                           "restore_sums": list(self.restore_sums)})

    @classmethod
    def from_json(cls, text: str | None) -> CostModel:
        """A model from `to_json` output; anything unreadable gives a fresh model (it is only an estimate). An
        older daemon's (no fixed part, no sums) keeps its rates and starts the fit afresh."""
        try:
            data = json.loads(text or "{}")
            model = cls(_positive(data.get("prefill_s_per_token")), _positive(data.get("restore_s_per_byte")))
            sums = data.get("restore_sums")
            if isinstance(sums, list) and len(sums) == 5 and all(_positive(v) is not None for v in sums):
                model.restore_sums = tuple(float(v) for v in sums)
                model.restore_s_fixed, model.restore_s_per_byte = fit_restore(model.restore_sums)
            return model
        except (ValueError, AttributeError, TypeError):
            return cls()


def fit_restore(sums: tuple[float, ...]) -> tuple[float, float]:
    """(fixed seconds, seconds per byte) of the weighted least-squares line through the observed restores and the
    pseudo-observation (0 bytes, RESTORE_FIXED_S); when the data put the fixed part below zero or the rate at or
    below zero, the line through the origin."""
    w, x, y, xx, xy = sums
    w, y = w + PRIOR_WEIGHT, y + PRIOR_WEIGHT * RESTORE_FIXED_S  # the pseudo-observation adds nothing to x, xx, xy
    rate = (w * xy - x * y) / (w * xx - x * x)  # > 0 denominator: the pseudo-observation sits apart from any restore
    fixed = (y - rate * x) / w
    if fixed < 0 or rate <= 0:  # noise (larger restores were quicker): all of it per byte, as before the fit
        return 0.0, xy / xx
    return fixed, rate


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


def _positive(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None
