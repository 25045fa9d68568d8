"""What the runtime asks of a prefix cache, whichever backend built it (the torch backend's PrefixCache over
per-layer tensors, kvcache/sequence_cache.SequencePrefixCache over llama.cpp's sequences). The runtime is typed
against these, so it never names a backend's cache; a backend's engine reads its own cache's lease.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from zllm.kvcache.config import CacheConfig
from zllm.diagnosis.near_miss import NearMiss


class Lease(Protocol):
    """One request's view of the cache, from acquire until finish or release."""

    cached_tokens: int  # the prompt's tokens the cache holds (restored, or being restored from SSD)
    tier: str  # where they came from: "device", "ssd", "miss"
    rejected: str | None  # why a candidate entry was not used
    near_miss: NearMiss | None
    pending: Any  # an SSD read still to run (read_ssd, complete_ssd) before the row begins; None: none


class PrefixCache(Protocol):
    config: CacheConfig
    store: Any  # the SSD tier; None without one

    def acquire(self, namespace: str, prompt: Sequence[int], *, hint: str | None = None, max_new_tokens: int = 1,
                describe_position: Callable[[int], str] | None = None, request_id: str = "",
                defer: bool = False) -> Lease: ...

    def diagnose(self, lease: Lease) -> None: ...

    def read_ssd(self, lease: Lease) -> Any: ...

    def complete_ssd(self, lease: Lease, outcome: Any) -> None: ...

    def admission_need(self, prompt_tokens: int, max_new_tokens: int) -> int: ...

    def admission_room(self) -> int: ...

    def observe_prefill(self, tokens: int, seconds: float) -> None: ...

    def finish(self, lease: Lease, sequence: Sequence[int], state: Any, *, entry_id: str, prompt_length: int,
               hint_key: str | None = None, buffers: Any = None) -> bool: ...

    def release(self, lease: Lease, buffers: Any = None) -> None: ...

    def close(self) -> None: ...
