"""What the prefix cache tells the outside: its tiers, its stats and its entries, as typed values.

The prefix cache (kvcache/prefix_cache.py, over torch tensors or llama.cpp sequences) produces these;
the control socket turns them into JSON in one place (`to_json`) and the CLI reads them back in
one place (`from_json`), so a renamed field fails where it is built instead of silently reading 0 on the far
side of the socket.

    stats = cache.stats()                  # CacheStats: device and counter fields, .ssd (SsdStats | None)
    stats.to_json()                        # {"device_bytes": ..., "ssd_bytes": ..., "device_fill": 0.25, ...}
    CacheStats.from_json(data)             # the CLI's view of that JSON (unknown keys ignored, missing defaulted)
    [CacheEntry(tier=Tier.DEVICE, ...)]    # cache.entries(), `zllm cache ls`

A leaf module: the standard library only, so the cache layer, the control socket and the CLI all import it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any


class Tier(StrEnum):
    """Where a request's cached prefix came from, or where an entry lives. A StrEnum: logs, traces and JSON
    keep the same words ("device", "ssd-hint", ...)."""

    COLD = "cold"  # nothing reused
    DEVICE = "device"
    DEVICE_HINT = "device-hint"  # the device entry a client's cache key named
    SSD = "ssd"
    SSD_HINT = "ssd-hint"  # the SSD snapshot a client's cache key named

    @property
    def on_device(self) -> bool:
        return self in (Tier.DEVICE, Tier.DEVICE_HINT)

    @property
    def from_ssd(self) -> bool:
        return self in (Tier.SSD, Tier.SSD_HINT)

    @staticmethod
    def hit(store: Tier, hinted: bool) -> Tier:
        """A hit on `store` (DEVICE or SSD), by a client's key or by the longest prefix."""
        if store is Tier.DEVICE:
            return Tier.DEVICE_HINT if hinted else Tier.DEVICE
        return Tier.SSD_HINT if hinted else Tier.SSD


STORE_TIERS = (Tier.DEVICE, Tier.SSD)  # the tiers that hold entries (what `cache ls` lists, `cache prune` trims)
ALL_TIERS = "all"
PRUNE_CHOICES = (*STORE_TIERS, ALL_TIERS)  # what `zllm cache prune --tier` (control: `tier`) may name


def prune_tiers(choice: str) -> tuple[Tier, ...]:
    """The tiers a `--tier` choice (one of PRUNE_CHOICES) names."""
    return STORE_TIERS if choice == ALL_TIERS else (Tier(choice),)


def _known(cls, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of `data` that `cls` has fields for: a newer or older daemon's JSON still reads."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


@dataclass(frozen=True)
class CacheEntry:
    """One cached entry: a device-tier entry or an SSD snapshot."""

    tier: Tier  # DEVICE or SSD
    id: str
    namespace: str
    tokens: int
    prompt_tokens: int = 0
    bytes: int = 0  # device: bytes freed if only this entry went; ssd: the snapshot's size
    round: int = 1
    hits: int = 0
    created: float = 0.0
    last_used: float | None = None  # SSD snapshots: when a request last restored it

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CacheEntry:
        known = _known(cls, data)
        tier = known.get("tier")
        return cls(**{**known, "tier": Tier(tier) if tier in Tier._value2member_map_ else tier})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SsdStats:
    """The SSD tier's side of the stats (JSON: each field as `ssd_<field>`). The write/restore/eviction counters
    are counted by the SSD store (kvcache/snapshot_store.py); None where none counts them (left out of JSON)."""

    snapshots: int = 0
    bytes: int = 0
    budget_bytes: int = 0
    quarantined: int = 0  # damaged snapshots set aside
    index_set_aside: int = 0  # 1 when the index itself was unreadable and set aside at open
    strays: int = 0  # files in the blob directory the tier did not name (out-of-range generations too), set aside
    dropped_jobs: int = 0  # snapshot writes dropped because the writer's queue was full
    writes: int | None = None
    writes_skipped: int | None = None
    restores: int | None = None
    evicted: int | None = None
    superseded: int | None = None  # deleted when a newer snapshot of the same conversation held all of them


@dataclass(frozen=True)
class CacheStats:
    """`zllm cache stats`: the device tier, the request counters and the SSD tier (None when there is none)."""

    device_bytes: int = 0
    device_budget_bytes: int = 0
    pool_bytes: int = 0  # working buffers (torch) / pool cells entries do not hold (llama.cpp)
    pool_in_use_bytes: int = 0  # working buffers of running requests
    retained_bytes: int = 0  # bytes on retained entries' paths
    entries: int = 0
    nodes: int = 0
    namespaces: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    device_hits: int = 0
    ssd_hits: int = 0
    ssd_not_worth_it: int = 0  # SSD prefixes left unread: recomputing was estimated faster
    ssd_rejected: int = 0  # SSD restores refused (a damaged or incompatible snapshot)
    kept: int = 0  # finished requests whose state the device tier kept
    not_kept: int = 0
    main_spared: int = 0  # evictions that took a side request's state instead of a namespace's main conversation
    near_misses: int = 0
    # the restore-vs-recompute estimate (kvcache/cost.py): measured as the daemon runs; None until measured
    prefill_s_per_token: float | None = None
    restore_s_per_byte: float | None = None
    restore_s_fixed: float | None = None  # a restore's cost whatever its size
    ssd: SsdStats | None = None
    ssd_off: str | None = None  # why a configured SSD tier could not open this run

    @property
    def device_fill(self) -> float | None:
        return _ratio(self.device_bytes, self.device_budget_bytes)

    @property
    def ssd_fill(self) -> float | None:
        return _ratio(self.ssd.bytes, self.ssd.budget_bytes) if self.ssd is not None else None

    @property
    def device_hit_rate(self) -> float | None:
        return _ratio(self.device_hits, self.requests)

    @property
    def ssd_hit_rate(self) -> float | None:
        return _ratio(self.ssd_hits, self.requests)

    @property
    def token_hit_rate(self) -> float | None:
        return _ratio(self.cached_tokens, self.prompt_tokens)

    @property
    def cold(self) -> int:
        return self.requests - self.device_hits - self.ssd_hits

    def to_json(self) -> dict[str, Any]:
        """Flat, as the control socket has always answered: the SSD fields prefixed `ssd_`, `ssd_off` only when
        the tier is off for a reason, and the fill and hit rates."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("ssd", "ssd_off")}
        if self.ssd is not None:
            data |= {f"ssd_{k}": v for k, v in asdict(self.ssd).items() if v is not None}
        elif self.ssd_off:
            data["ssd_off"] = self.ssd_off
        return data | {"device_fill": self.device_fill, "ssd_fill": self.ssd_fill,
                       "device_hit_rate": self.device_hit_rate, "ssd_hit_rate": self.ssd_hit_rate,
                       "token_hit_rate": self.token_hit_rate}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CacheStats:
        """The inverse of `to_json` (the rates are recomputed, not read)."""
        ssd_keys = {f"ssd_{f.name}": f.name for f in fields(SsdStats)}
        ssd = {ssd_keys[k]: v for k, v in data.items() if k in ssd_keys}
        top = {k: v for k, v in _known(cls, data).items() if k not in ("ssd", *ssd_keys)}
        return cls(**top, ssd=SsdStats(**ssd) if "ssd_bytes" in data else None)


@dataclass(frozen=True)
class PruneCounts:
    """What a cache's prune freed: device bytes, SSD snapshots removed."""

    device_freed_bytes: int = 0
    ssd_removed: int = 0
