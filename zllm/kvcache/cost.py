"""Restore-vs-recompute estimate: is reading a snapshot from SSD faster than prefilling its tokens again?

On a CPU a restore is far cheaper than recompute; on a fast GPU a short prefix can be quicker to recompute than
to read (SGLang measured a file-tier hit slower than recompute at 8K tokens on H-class GPUs). So both rates
are measured as the daemon runs — prefill seconds per token from real prefills, restore seconds per byte from
real restores — as exponential moving averages, and persisted per (model layout, device) so a restart starts
from the last estimate. Until a rate has been measured, restores are assumed to pay (they do on every
machine measured so far for long prefixes, and a first restore is what measures them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

SMOOTHING = 0.3  # weight of the newest observation
MIN_OBSERVED_TOKENS = 16  # shorter prefills are dominated by fixed overhead, not per-token cost
SAFETY = 1.25  # restore must beat recompute by this factor when both are measured (reads vary more)


@dataclass
class CostModel:
    prefill_s_per_token: float | None = None
    restore_s_per_byte: float | None = None
    restore_s_fixed: float = 0.0  # per-restore overhead (opening files, validating headers)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_OBSERVED_TOKENS and seconds > 0:
            self.prefill_s_per_token = _ema(self.prefill_s_per_token, seconds / tokens)

    def observe_restore(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.restore_s_per_byte = _ema(self.restore_s_per_byte, seconds / nbytes)

    def restore_pays(self, tokens: int, nbytes: int) -> bool:
        if self.prefill_s_per_token is None or self.restore_s_per_byte is None:
            return True
        restore = self.restore_s_fixed + nbytes * self.restore_s_per_byte
        return restore * SAFETY < tokens * self.prefill_s_per_token

    def to_json(self) -> str:
        return json.dumps({"prefill_s_per_token": self.prefill_s_per_token,
                           "restore_s_per_byte": self.restore_s_per_byte})

    @classmethod
    def from_json(cls, text: str | None) -> CostModel:
        """A model from `to_json` output; anything unreadable gives a fresh model (it is only an estimate)."""
        try:
            data = json.loads(text or "{}")
            return cls(_positive(data.get("prefill_s_per_token")), _positive(data.get("restore_s_per_byte")))
        except (ValueError, AttributeError):
            return cls()


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


def _positive(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None
