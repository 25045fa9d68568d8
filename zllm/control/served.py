"""What the control methods may ask of the engine the daemon serves, and of its prefix cache: nothing more.

    engine: ServedEngine = LocalEngineClient(...)     # the production one (zllm/runtime/client.py)
    engine.queue_waiting                              # requests waiting for the engine (`zllm status`)
    engine.dialect_choice.name, .reason               # the tool dialect and why (`zllm ps`)
    engine.prefix_cache                               # a ServedCache, or None when the cache is off
    engine.explain_near_miss(record)                  # one of its near misses explained (`zllm cache explain-miss`)
    engine.cache_diagnosis("msg_…")                   # (namespace, the diagnosis that response carried) | None

The prefix cache (kvcache/prefix_cache.py, on either backend) is a ServedCache. Runtime-checkable:
tests/unit/control/test_served_contract.py checks that the real client and the real cache on both backends satisfy these,
so a rename on either side fails there instead of as an AttributeError on the control socket.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from zllm.cache_views import CacheEntry, CacheStats, PruneCounts, Tier


class DialectFacts(Protocol):
    """Which tool dialect the model speaks and why (zllm.dialects.registry.DialectChoice)."""

    @property
    def name(self) -> str: ...

    @property
    def reason(self) -> str: ...


class NearMissRecord(Protocol):
    """A near miss (zllm.diagnosis.near_miss.NearMiss, recorded by the prefix cache): sent as its fields."""

    @property
    def entry_id(self) -> str: ...

    @property
    def divergence(self) -> int: ...

    @property
    def request_id(self) -> str: ...


class JsonView(Protocol):
    """A diagnosis value (zllm.diagnosis: MissExplanation, CacheDiagnosis): sent as its `to_json()`."""

    def to_json(self) -> dict: ...


@runtime_checkable
class ServedCache(Protocol):
    """The prefix cache's any-thread surface (the control methods call it from a worker thread)."""

    def stats(self) -> CacheStats: ...

    def entries(self) -> list[CacheEntry]: ...

    def prune(self, *, older_than_s: float | None = None, max_bytes: int | None = None,
              namespace: str | None = None, tiers: tuple[Tier, ...] = ...) -> PruneCounts: ...

    def near_misses(self) -> list[NearMissRecord]: ...


@runtime_checkable
class ServedEngine(Protocol):
    @property
    def queue_waiting(self) -> int: ...

    @property
    def dialect_choice(self) -> DialectFacts: ...

    @property
    def prefix_cache(self) -> ServedCache | None: ...

    def explain_near_miss(self, record: NearMissRecord) -> JsonView | None:
        """Why the request of `record` missed (None: this engine cannot say). Blocking: a worker thread calls it."""
        ...

    def cache_diagnosis(self, response_id: str) -> tuple[str, JsonView] | None:
        """(namespace, diagnosis) made for `response_id` (None: none kept). Blocking."""
        ...
