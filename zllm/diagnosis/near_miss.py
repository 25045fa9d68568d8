"""The near-miss log: requests that *almost* hit — the raw material for `zllm cache explain-miss`.

A request is a near miss of a cached sequence when it shares at least `min_tokens` leading tokens and more
than `min_fraction` of that sequence, but not all of it: something changed inside what was cached (a
timestamp in the system prompt, a re-rendered tool call, a per-session header). The record keeps where the
two diverge and a decoded window on both sides; `in_prompt` tells whether the divergence falls in the cached
sequence's prompt (history changed: a cache-buster) or in its generated output (the template re-rendered
the previous answer differently — expected for some templates, e.g. ones that strip reasoning).

`segment` names the part of the request's prompt the divergence falls in ("system", "tools", "message 3
(user)", "generation prompt"): the caller passes `describe(index) -> str` (segments.py, wrapped by
the runtime), called here once per record. It tokenizes the prompt again and runs the template a dozen times
on the thread that records, the engine thread, before the request's prefill; near misses are rare, so that
cost is accepted.

Bounded: the newest `capacity` records, in memory. Decoding and describing are injected (`decode(ids) -> str`)
because the cache layer must not import tokenizer or prompt code. This module is the prefix caches' one door
into the diagnosis package: it imports the standard library and zllm.cache_views only (tests/unit/test_layering.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from zllm.cache_views import Tier

log = logging.getLogger("zllm.kvcache")

WINDOW_TOKENS = 24


@dataclass(frozen=True)
class NearMiss:
    namespace: str
    entry_id: str  # the cached sequence the request diverged from
    tier: Tier  # DEVICE or SSD: where the diverging entry lives
    divergence: int  # index of the first differing token
    entry_tokens: int
    request_tokens: int
    in_prompt: bool | None  # None when the tier does not know the entry's prompt length
    before: str  # decoded tokens [divergence - WINDOW, divergence), shared by both
    request_after: str  # what the request has from the divergence on
    entry_after: str  # what the cached sequence had there
    segment: str | None = None  # where in the request's prompt: "message 3 (user)" (None: no describer given)
    request_id: str = ""  # the request that missed (`zllm cache explain-miss REQUEST_ID`)
    at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        assert 0 <= self.divergence < self.entry_tokens


class NearMissLog:
    def __init__(self, decode: Callable[[Sequence[int]], str] | None = None, *, capacity: int = 64,
                 min_tokens: int = 1024, min_fraction: float = 0.9):
        self._decode = decode or (lambda ids: " ".join(map(str, ids)))
        self.min_tokens = min_tokens
        self.min_fraction = min_fraction
        self._records: deque[NearMiss] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def qualifies(self, shared: int, entry_length: int, request_length: int) -> bool:
        """Both sequences go on past `shared` with different tokens (a request that is merely a prefix of
        the cached sequence, a retry or rewind, diverges from nothing: it is a full hit)."""
        return (shared >= self.min_tokens and shared > self.min_fraction * entry_length
                and shared < min(entry_length, request_length))

    def record(self, *, namespace: str, entry_id: str, tier: Tier, request: Sequence[int], entry: Sequence[int],
               shared: int, prompt_length: int | None = None,
               describe: Callable[[int], str] | None = None, request_id: str = "") -> NearMiss:
        lo = max(0, shared - WINDOW_TOKENS)
        miss = NearMiss(
            namespace=namespace, entry_id=entry_id, tier=tier, divergence=shared, entry_tokens=len(entry),
            request_tokens=len(request), in_prompt=None if prompt_length is None else shared < prompt_length,
            before=self._safe_decode(request[lo:shared]),
            request_after=self._safe_decode(request[shared:shared + WINDOW_TOKENS]),
            entry_after=self._safe_decode(entry[shared:shared + WINDOW_TOKENS]),
            segment=_safe_describe(describe, shared),
            request_id=request_id,
        )
        with self._lock:
            self._records.append(miss)
        level = logging.INFO if miss.in_prompt is not False else logging.DEBUG
        log.log(level, "kv cache near miss: diverged from %s (%s) at token %d of %d%s%s: cached %r, request %r",
                entry_id, tier, shared, len(entry), " (in its prompt)" if miss.in_prompt else "",
                f", in the request's {miss.segment}" if miss.segment else "",
                miss.entry_after[:60], miss.request_after[:60])
        return miss

    def records(self) -> list[NearMiss]:
        with self._lock:
            return list(self._records)

    def _safe_decode(self, ids: Sequence[int]) -> str:
        try:
            return self._decode(list(ids))
        except Exception:  # a diagnostic must never fail the request
            return " ".join(map(str, ids))


def _safe_describe(describe: Callable[[int], str] | None, index: int) -> str | None:
    if describe is None:
        return None
    try:
        return describe(index)
    except Exception:  # a diagnostic must never fail the request
        log.debug("describing token %d of a near miss failed", index, exc_info=True)
        return None
