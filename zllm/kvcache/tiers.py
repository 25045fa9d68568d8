"""`CacheTiers`: what the prefix cache (prefix_cache.py) holds around its device tier — the SSD store and its writer
thread, the measured restore-vs-recompute estimate, the near-miss log and the counters. `BaseLease`: what a lease
holds of contract.py's `CacheLease` (prefix_cache.Lease adds the backend's running sequence, `kv`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TypeVar

from zllm.cache_views import CacheEntry, Tier
from zllm.diagnosis.near_miss import NearMiss, NearMissLog
from zllm.kvcache.cost import CostModel
from zllm.kvcache.retention import Eviction
from zllm.kvcache.ssd_index import IndexLocked
from zllm.kvcache.writer import SnapshotWriter

log = logging.getLogger("zllm.kvcache")
Store = TypeVar("Store")



@dataclass(slots=True)
class Counters:
    """What both caches count (CacheStats carries them out). Slots: a misspelt counter fails where it is bumped."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    device_hits: int = 0
    ssd_hits: int = 0
    ssd_not_worth_it: int = 0
    ssd_rejected: int = 0
    kept: int = 0
    not_kept: int = 0
    main_spared: int = 0  # evictions the main-conversation rule steered away from a namespace's main conversation


@dataclass(eq=False)
class BaseLease:
    """One request's use of a prefix cache, from admission to finish: the fields every backend's lease has."""

    namespace: str
    prompt: tuple[int, ...]
    cached_tokens: int  # [0, cached_tokens) of the prompt is restored
    tier: Tier  # where the cached prefix came from (COLD: nowhere)
    round: int = 1
    hint: str | None = None
    restore_s: float = 0.0
    near_miss: NearMiss | None = None
    rejected: str | None = None  # why an SSD snapshot this request would have restored was set aside (trace)
    # acquired with defer=True: an SSD read still to run (the cache's match; read_ssd on any thread, then
    # complete_ssd), and the near-miss diagnosis still to make (any thread); both None once done or when none
    pending: object | None = None
    diagnose: Callable[[], None] | None = field(default=None, repr=False)
    done: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        assert 0 <= self.cached_tokens < len(self.prompt), "at least one prompt token is always prefilled"


def open_ssd_tier(open_store: Callable[[], Store]) -> tuple[Store | None, str | None]:
    """(the SSD store, None) or, when its index is locked by another process, (None, why the tier is off): the
    daemon serves cold rather than fail to start or take over an index someone else is using."""
    try:
        return open_store(), None
    except IndexLocked as exc:
        log.warning("kv cache: SSD tier off for this run: %s", exc)
        return None, str(exc)


class CacheTiers:
    def __init__(self, config, store, cost_key: str, decode: Callable[[Sequence[int]], str] | None,
                 ssd_off: str | None = None):
        """`store`: the SSD tier (snapshot_store.SnapshotStore), None without one; `ssd_off`: why a
        configured SSD tier could not be opened (reported in the stats)."""
        self.config = config
        self.ssd_off = ssd_off
        self.near_miss_log = NearMissLog(decode, min_tokens=config.near_miss_min_tokens,
                                         min_fraction=config.near_miss_fraction)
        self.store = store
        self.writer = SnapshotWriter(store) if store is not None else None
        self._cost_key = cost_key
        self.cost = CostModel.from_json(store.index.get_meta(cost_key) if store is not None else None)
        self._lock = threading.RLock()
        self.counters = Counters()

    @property
    def keeps_state(self) -> bool:
        """Whether a finished request's state is kept anywhere: resident rounds or an SSD tier."""
        return self.config.rounds > 0 or self.store is not None

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """The engine's measured prefill time; feeds the restore-vs-recompute estimate."""
        self.cost.observe_prefill(tokens, seconds)

    def _count_acquired(self, prompt_tokens: int, lease: BaseLease) -> None:
        """A request's lease in the counters: requests, tokens, device hits (caller holds the lock)."""
        self.counters.requests += 1
        self.counters.prompt_tokens += prompt_tokens
        self.counters.cached_tokens += lease.cached_tokens
        if lease.tier.on_device:
            self.counters.device_hits += 1

    def _spared(self, eviction: Eviction) -> None:
        """The main-conversation rule kept `eviction.spared` where LRU would have evicted it (caller holds the lock)."""
        self.counters.main_spared += 1
        spared, victim = eviction.spared, eviction.victim
        log.debug("kv cache: kept the main conversation of namespace %s (%d tokens) hot; %s", spared.namespace[:8],
                  spared.length, f"evicted a {victim.length}-token entry instead" if victim is not None
                  else "a side request's state is not kept")

    def near_misses(self) -> list[NearMiss]:
        return self.near_miss_log.records()

    def flush(self) -> None:
        """Wait for queued SSD writes (tests, benchmarks, shutdown)."""
        if self.writer is not None:
            self.writer.flush()

    @staticmethod
    def diagnose(lease) -> None:
        """Record the lease's near miss, if it is one (any thread: it may render the prompt's segments)."""
        diagnose, lease.diagnose = lease.diagnose, None
        if diagnose is not None:
            diagnose()

    def _common_stats(self) -> dict[str, object]:
        """CacheStats' fields that do not depend on what a device entry is (caller holds the lock)."""
        return {**asdict(self.counters), "near_misses": len(self.near_miss_log.records()),
                "prefill_s_per_token": self.cost.prefill_s_per_token,
                "restore_s_per_byte": self.cost.restore_s_per_byte, "restore_s_fixed": self.cost.restore_s_fixed}

    def _ssd_stats(self) -> dict[str, object]:
        """CacheStats' `ssd` / `ssd_off`."""
        if self.store is None:
            return {"ssd": None, "ssd_off": self.ssd_off}
        return {"ssd": replace(self.store.stats(), dropped_jobs=self.writer.dropped if self.writer else 0)}

    def _ssd_entries(self) -> list[CacheEntry]:
        return [CacheEntry(tier=Tier.SSD, id=r.id, namespace=r.namespace, tokens=r.length, prompt_tokens=r.prompt_len,
                           bytes=r.nbytes, round=r.round, hits=r.hits, created=r.created, last_used=r.last_used)
                for r in (self.store.snapshots() if self.store else [])]

    def _close_tiers(self) -> None:
        """Finish queued SSD writes (the next start finds the last turns), keep the estimate, close the index."""
        if self.writer is not None:
            self.writer.close()
        if self.store is not None:
            self.store.index.set_meta(self._cost_key, self.cost.to_json())
            self.store.close()
