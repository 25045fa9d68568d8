"""The loop guard: notices a generation stuck repeating itself, bans the token that would continue the loop,
and ends the request (FinishReason.REPETITION) when the model keeps looping anyway.

What counts as a loop, on token ids (no text, no torch):

    period 1   " the the the the the …"               one token, min_span times in a row
    period p   "I will go. I will go. I will go. …"    the last p tokens, min_repeats times back to back,
                                                       covering at least min_span tokens
    calls      the same tool name + arguments (JSON compared by value) max_identical_calls times in one output

Per token (`observe`) the guard keeps, for each period p ≤ max_period, how many consecutive positions had
`token[i] == token[i - p]`; a run of r such positions means the last r + p tokens repeat with period p. That
is O(max_period) per token over a ring of the last max_period tokens, whatever the output length.

The runtime's step, with the fence (which decides what is valid) applied first:

    fence.apply(logits)
    guard.ban(logits, fence)       # -inf on the loop's next token, unless nothing else would be allowed
    token = sample(logits); fence.advance(token); guard.observe(token)
    if (stop := guard.verdict()) is not None: finish(stop.reason)

A ban breaks the loop where it stands; a model that is truly stuck re-enters it, and once a loop is back after
max_bans bans — or a loop outgrows twice its detection span because nothing banned it — the verdict is stop.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from zllm.canonical import FinishReason


@dataclass(frozen=True)
class LoopGuardConfig:
    """Thresholds. The defaults leave normal text, code and JSON alone — repeated lines, arrays of similar
    objects, table rules, an 8-row board of identical rows — and catch degenerate loops within a few
    hundred tokens."""

    # longest repeated pattern looked for, in tokens (cost per token is linear in it)
    max_period: int = 64
    # a pattern must repeat at least this many times back to back (8 identical rows of a board must pass)
    min_repeats: int = 10
    # ... and the repetition must cover at least this many tokens (a 64-token run of one token)
    min_span: int = 64
    # loops banned before the next one ends the request
    max_bans: int = 3
    # this many tokens without a loop forgive earlier bans (a long answer may repeat itself now and then)
    forgive_after: int = 512
    # the same tool call (name and arguments) this many times in one output ends the request
    max_identical_calls: int = 3

    def __post_init__(self) -> None:
        assert self.max_period >= 1 and self.min_repeats >= 2 and self.min_span >= 2
        assert self.max_bans >= 0 and self.forgive_after >= 1 and self.max_identical_calls >= 2

    def span_needed(self, period: int) -> int:
        """Tokens a period-`period` repetition must cover to count as a loop."""
        return max(self.min_span, self.min_repeats * period)


@dataclass(frozen=True)
class Loop:
    period: int  # tokens in the repeated pattern
    span: int  # tokens at the tail covered by the repetition (first copy included)
    next_token: int  # the token that would continue it


@dataclass(frozen=True)
class LoopVerdict:
    detail: str  # for the log: what repeated
    reason: FinishReason = FinishReason.REPETITION


class MaskView(Protocol):
    """What the guard asks of a fence (zllm.runtime.fence.Fence satisfies it)."""

    def allowed(self, token_id: int) -> bool: ...

    def allows_other_than(self, token_id: int) -> bool: ...


@dataclass
class LoopGuard:
    """One request's guard. Not thread-safe: the engine thread owns it."""

    config: LoopGuardConfig = field(default_factory=LoopGuardConfig)
    observed: int = 0  # tokens seen
    bans: int = 0  # loops banned since the last forgiveness
    _ring: list[int] = field(init=False)  # the last max_period tokens; token i at i % max_period
    _runs: list[int] = field(init=False)  # _runs[p]: consecutive positions with token[i] == token[i - p]
    _span_needed: list[int] = field(init=False)  # config.span_needed(p), precomputed
    _loop: Loop | None = field(init=False, default=None)  # the loop at the tail, as of the last observe
    _last_loop_at: int = field(init=False, default=0)  # `observed` when a loop was last seen
    _calls: Counter = field(init=False, default_factory=Counter)  # (name, arguments by value) → count
    _most_repeated_call: tuple[str, int] = field(init=False, default=("", 0))

    def __post_init__(self) -> None:
        self._ring = [-1] * self.config.max_period
        self._runs = [0] * (self.config.max_period + 1)
        self._span_needed = [self.config.span_needed(period) for period in range(self.config.max_period + 1)]

    # ------------------------------------------------------------------ feeding

    def observe(self, token_id: int) -> None:
        """The token just sampled (and accepted). O(max_period): one pass updates every period's run and
        notes the shortest period whose repetition is long enough to be a loop."""
        ring, runs, needed = self._ring, self._runs, self._span_needed
        size, n = self.config.max_period, self.observed
        loop_period = 0
        for period in range(1, min(n, size) + 1):
            if ring[(n - period) % size] == token_id:
                runs[period] += 1
                if not loop_period and runs[period] + period >= needed[period]:
                    loop_period = period
            else:
                runs[period] = 0
        ring[n % size] = token_id
        self.observed = n + 1
        self._loop = None
        if loop_period:
            next_token = ring[(n + 1 - loop_period) % size]
            self._loop = Loop(loop_period, runs[loop_period] + loop_period, next_token)
            self._last_loop_at = self.observed
        elif self.bans and self.observed - self._last_loop_at >= self.config.forgive_after:
            self.bans = 0

    def observe_call(self, name: str, arguments: str) -> None:
        """A completed tool call (the parser's ToolCallEnd)."""
        key = (name, _comparable_arguments(arguments))
        self._calls[key] += 1
        if self._calls[key] > self._most_repeated_call[1]:
            self._most_repeated_call = (name, self._calls[key])

    # ------------------------------------------------------------------ before sampling

    def current_loop(self) -> Loop | None:
        """The shortest-period repetition at the tail that is long enough to count as a loop."""
        return self._loop

    def next_banned(self) -> int | None:
        """The token that would continue the current loop (the token one period back), if there is a loop."""
        loop = self.current_loop()
        return loop.next_token if loop is not None else None

    def ban(self, logits, fence: MaskView | None = None) -> int | None:
        """Mask the loop's next token in `logits` ([vocab], after the fence) unless the fence already forbids it
        or allows nothing else (a grammar-forced token is never banned). Returns the banned id, or None."""
        token_id = self.next_banned()
        if token_id is None:
            return None
        if fence is not None and not (fence.allowed(token_id) and fence.allows_other_than(token_id)):
            return None
        logits[token_id] = float("-inf")
        self.bans += 1
        return token_id

    # ------------------------------------------------------------------ after sampling

    def verdict(self) -> LoopVerdict | None:
        """Stop (REPETITION) when a loop is back after max_bans bans, when one ran to twice its detection span
        unbanned, or when a tool call repeated max_identical_calls times. None: keep going."""
        config = self.config
        name, count = self._most_repeated_call
        if count >= config.max_identical_calls:
            return LoopVerdict(f"tool call {name} made {count} times with the same arguments")
        loop = self._loop
        if loop is None:
            return None
        what = f"token {loop.next_token}" if loop.period == 1 else f"a {loop.period}-token pattern"
        repeats = loop.span // loop.period
        if self.bans >= config.max_bans:
            return LoopVerdict(f"{what} repeated {repeats} times after {self.bans} bans")
        if loop.span >= 2 * config.span_needed(loop.period):
            return LoopVerdict(f"{what} repeated {repeats} times")
        return None


def _comparable_arguments(arguments: str) -> str:
    """Arguments by value: key order and spacing do not make two calls different."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return arguments.strip()
