"""Who runs next: admission of waiting requests and the split of each step's prefill budget — a pure policy.

    admission = plan_admission(config, waiting, running=len(rows), room=cache room)   # which start, which end
    prefill = plan_prefill(config, prefilling, decoding=rows feeding a token)         # who prefills how much

The engine loop (engine_loop.py) gathers the facts (what waits and for how long, what each request needs of
the cache and how much room it has), asks these functions, and carries the answer out. Nothing here touches a
model, a cache or a clock, so every rule below is a unit test (tests/unit/runtime/test_scheduler.py).

Every engine step is one forward over the rows' tokens (engine/torch/packed.py): one token per decoding row (or a
speculative draft), plus prefill chunks of rows whose prompt is not in their cache yet. The policy:

- **Batch size**: at most `max_batch` rows run together; the rest wait in arrival order.
- **Chunked prefill**: while any other row runs, a step carries at most `prefill_chunk` prompt tokens, so a
  30K-token prompt delays the running rows' next token by one chunk's forward per step instead of by its whole
  prefill. Smaller chunks mean steadier inter-token latency for running rows; larger ones a shorter
  time-to-first-token for the long prompt (fewer, fuller forwards). A row prefilling alone takes
  `idle_prefill_chunk` per step (activation memory is the only limit); a request arriving meanwhile waits
  for at most that one forward.
- **Prefill order**: the budget goes to the prompts with the fewest tokens left first, each taking only what it
  still needs, the longest taking the rest — a short prompt arriving during a long prefill gets its first
  token after a step or two, and the long one still advances every step. It cannot be starved: at most
  `max_batch - 1` rows run beside it, and each short prompt leaves the prefill queue within a few steps.
- **Admission under the cache budget**: a request is admitted when its working KV buffers (prompt + reserved
  decode) fit the device budget beside the rows already running (cached entries are evicted to make room, and
  an evicted entry already has its SSD snapshot). One that does not fit waits; later requests that do fit may
  pass it, but only for `fair_wait_s`: after that nobody passes it, running rows drain, and it gets the room.
  A request is never refused for memory, and a lone request always runs.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

Row = TypeVar("Row")
Request = TypeVar("Request")


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 8  # rows decoding or prefilling together
    prefill_chunk: int = 512  # prompt tokens per step while other rows decode
    idle_prefill_chunk: int = 512  # prompt tokens per step for a row prefilling alone (larger suits a GPU)
    fair_wait_s: float = 5.0  # how long later requests may pass one that waits for memory

    def __post_init__(self) -> None:
        assert self.max_batch >= 1 and self.prefill_chunk >= 1 and self.idle_prefill_chunk >= 1
        assert self.fair_wait_s >= 0


class WaitingLine:
    """Requests not yet running, in arrival order (engine thread; `len` may be read from any thread)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._line: deque = deque()
        self._clock = clock

    def __len__(self) -> int:
        return len(self._line)

    def add(self, request) -> None:
        self._line.append((self._clock(), request))

    def candidates(self) -> Iterator:
        """Waiting requests, oldest first (a snapshot: removing while iterating is allowed)."""
        return (request for _, request in list(self._line))

    def remove(self, request) -> None:
        for item in self._line:
            if item[1] is request:
                self._line.remove(item)
                return

    def waited(self, request) -> float:
        for since, waiting in self._line:
            if waiting is request:
                return self._clock() - since
        return 0.0


def prefill_shares(needs: Sequence[tuple[Row, int]], budget: int) -> list[tuple[Row, int]]:
    """Split `budget` prompt tokens among rows still prefilling (`needs`: row, tokens it still needs): fewest
    tokens left first (ties in the given order, i.e. arrival), each row taking at most what it needs."""
    shares = []
    for row, need in sorted(needs, key=lambda item: item[1]):
        if budget <= 0:
            break
        take = min(need, budget)
        if take > 0:
            shares.append((row, take))
            budget -= take
    return shares


@dataclass(frozen=True)
class WaitingRequest:
    """What the policy knows of a request that waits: how long it has, whether its client hung up, and what
    it needs of the cache's room (in the cache's own unit: bytes of working buffers, or KV cells)."""

    request: object
    waited_s: float
    aborted: bool = False
    need: int = 0


@dataclass(frozen=True)
class Admission:
    """Waiting requests to end without running (their client hung up), and those to start, in order."""

    drop: tuple = ()
    start: tuple = ()


def plan_admission(config: SchedulerConfig, waiting: Sequence[WaitingRequest], *, running: int,
                   room: int | None) -> Admission:
    """Oldest first, while rows are free: a request starts when its need fits the room left (`room` None: the
    cache is off, everything fits) or nothing else runs; one that does not fit may be passed by later ones that
    do, until it has waited `fair_wait_s` — then nobody passes it. A hung-up request ends at once, even behind a
    full batch."""
    drop = tuple(w.request for w in waiting if w.aborted)
    start: list = []
    for candidate in (w for w in waiting if not w.aborted):
        if running + len(start) >= config.max_batch:
            break
        fits = room is None or candidate.need <= room
        if (running or start) and not fits:
            if candidate.waited_s >= config.fair_wait_s:
                break  # waited long enough: nobody passes it, the running rows drain and make room
            continue
        start.append(candidate.request)
        if room is not None:
            room -= candidate.need
    return Admission(drop, tuple(start))


def plan_prefill(config: SchedulerConfig, prefilling: Sequence[tuple[Row, int]], *, decoding: int
                 ) -> list[tuple[Row, int]]:
    """This step's prefill shares (`prefilling`: row, prompt tokens it still lacks) beside `decoding` rows that
    feed a token: a row prefilling alone takes `idle_prefill_chunk`, otherwise the rows share `prefill_chunk`."""
    alone = not decoding and len(prefilling) == 1
    return prefill_shares(prefilling, config.idle_prefill_chunk if alone else config.prefill_chunk)
