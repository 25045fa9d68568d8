"""The cache seam: what the runtime asks of a prefix cache and of the leases it hands out, and nothing more.

One cache fills it — `prefix_cache.PrefixCache`, over each backend's KV interface (kv_interface.py: torch's pooled
working buffers over a span tree of tensors, llama.cpp's own sequences) — and the engine loop is typed against
this, never against the class. The engine loop's use, in order (runtime/engine_loop.py):

    need = cache.admission_need(prompt_tokens, max_new_tokens)   # in the unit admission_room() answers in
    lease = cache.acquire(namespace, prompt, hint=..., max_new_tokens=..., describe_position=...,
                          request_id=..., defer=True)             # engine thread; memory only
    cache.diagnose(lease)                                         # any thread: the near-miss record, if any
    outcome = cache.read_ssd(lease)                               # any thread, when lease.pending is set
    cache.complete_ssd(lease, outcome)                            # engine thread: restored, or rejected
    seq = engine.open(lease)                                      # engine/contract.py: the backend reads the
                                                                  # lease its own cache made
    cache.observe_prefill(tokens, seconds)                        # the restore-vs-recompute estimate
    cache.finish(lease, tokens, kept.state, entry_id=..., prompt_length=..., buffers=kept.buffers)
    cache.release(lease, kept.buffers)                            # instead of finish: keep nothing

A lease's `cached_tokens` never covers the whole prompt (the last prompt token is always prefilled: its logits
are what the first output token is sampled from). The any-thread surface (stats, entries, prune, near_misses)
is control/served.py's `ServedCache`, which the cache also satisfies.

tests/unit/kvcache/test_cache_contract.py checks that the cache and its lease have this shape (names, parameters,
defaults) and runs one behavioural suite over both backends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from zllm.cache_views import STORE_TIERS, CacheEntry, CacheStats, PruneCounts, Tier
from zllm.kvcache.config import CacheConfig
from zllm.diagnosis.near_miss import NearMiss


class CacheLease(Protocol):
    """One request's use of a prefix cache, from admission to finish (what the runtime reads of it)."""

    namespace: str
    prompt: tuple[int, ...]
    cached_tokens: int  # [0, cached_tokens) of the prompt is restored; the rest is prefilled
    tier: Tier  # where the cached prefix came from (COLD: nowhere)
    round: int  # the conversation round this request is (1: a new conversation)
    hint: str | None
    restore_s: float
    near_miss: NearMiss | None
    rejected: str | None  # why an SSD snapshot this request would have restored was set aside
    pending: object | None  # an SSD read still to run (acquire(defer=True)); None once done or when none pays
    diagnose: Callable[[], None] | None  # the near-miss diagnosis still to make (acquire(defer=True))
    done: bool  # finished or released


LeaseT = TypeVar("LeaseT", bound=CacheLease)


class KVPrefixCache(Protocol[LeaseT]):
    """A prefix cache as the runtime uses it. Generic in its lease type: a cache takes back only the leases it
    made (the runtime holds them as `CacheLease` and hands each back to the cache it came from)."""

    config: CacheConfig

    # ------------------------------------------------------------------ engine thread: a request's life

    def acquire(self, namespace: str, prompt: Sequence[int], *, hint: str | None = None,
                max_new_tokens: int = 1, describe_position: Callable[[int], str] | None = None,
                request_id: str = "", defer: bool = False) -> LeaseT: ...

    def read_ssd(self, lease: LeaseT) -> Any: ...

    def complete_ssd(self, lease: LeaseT, outcome: Any) -> None: ...

    def admission_need(self, prompt_tokens: int, max_new_tokens: int) -> int: ...

    def admission_room(self) -> int: ...

    def observe_prefill(self, tokens: int, seconds: float) -> None: ...

    def finish(self, lease: LeaseT, sequence: Sequence[int], state: Any, *, entry_id: str,
               prompt_length: int, hint_key: str | None = None, buffers: Any = None) -> bool: ...

    def release(self, lease: LeaseT, buffers: Any = None) -> None: ...

    @property
    def keeps_state(self) -> bool:
        """Whether a finished request's state is kept anywhere (device rounds or an SSD tier)."""
        ...

    # ------------------------------------------------------------------ any thread

    def diagnose(self, lease: LeaseT) -> None: ...

    def stats(self) -> CacheStats: ...

    def entries(self) -> list[CacheEntry]: ...

    def prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None,
              namespace: str | None = None, tiers: tuple[Tier, ...] = STORE_TIERS) -> PruneCounts: ...

    def near_misses(self) -> list[NearMiss]: ...

    def flush(self) -> None: ...

    def check_integrity(self) -> None: ...

    def close(self) -> None: ...
