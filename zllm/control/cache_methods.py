"""`cache.*` control methods over the daemon's prefix cache (served.ServedCache: stats / entries / prune /
near_misses). The cache's typed views (zllm/cache_views.py) become JSON here and nowhere else.

These run in a worker thread (the SSD tier reads and deletes files; the device tier takes the cache lock the
engine thread also takes), never on the event loop.

    cache.ls          → {"entries": [CacheEntry, ...]}                    newest use first, device then SSD
    cache.stats       → {"enabled": true, ...CacheStats.to_json()}: counters, "device_fill": 0.42, ...
    cache.prune       {"older_than_s": 3600, "max_bytes": null, "tier": "all", "namespace": "3f2a", "dry_run": true}
                      → PruneReport (a dry run predicts from the listing: an estimate for size bounds)
    cache.near_misses → {"near_misses": [NearMiss as JSON, ...]}
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from zllm.cache_views import ALL_TIERS, PRUNE_CHOICES, CacheEntry, Tier, prune_tiers
from zllm.control.params import bool_param, float_param, int_param, str_param
from zllm.control.protocol import NOT_FOUND, ControlError, PruneReport
from zllm.control.served import NearMissRecord, ServedCache
from zllm.errors import InvalidRequest


def list_entries(cache: ServedCache) -> list[CacheEntry]:
    return cache.entries()


def entries_json(cache: ServedCache) -> dict[str, Any]:
    return {"entries": [e.to_json() for e in list_entries(cache)]}


def stats_json(cache: ServedCache | None) -> dict[str, Any]:
    return {"enabled": True, **cache.stats().to_json()} if cache is not None else {"enabled": False}


# ---------------------------------------------------------------------- prune


@dataclasses.dataclass(frozen=True)
class PruneRequest:
    older_than_s: float | None
    max_bytes: int | None
    tiers: tuple[Tier, ...]
    namespace: str | None
    dry_run: bool

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> PruneRequest:
        tier = str_param(params, "tier", ALL_TIERS, choices=PRUNE_CHOICES)
        request = cls(older_than_s=float_param(params, "older_than_s"), max_bytes=int_param(params, "max_bytes", None),
                      tiers=prune_tiers(tier),
                      namespace=str_param(params, "namespace"), dry_run=bool_param(params, "dry_run"))
        if request.older_than_s is None and request.max_bytes is None and request.namespace is None:
            raise InvalidRequest("nothing to prune by", hint="give an age, a size bound or a namespace")
        return request


def prune(cache: ServedCache, request: PruneRequest) -> PruneReport:
    before = list_entries(cache)
    namespace = resolve_namespace(request.namespace, before)
    if request.dry_run:
        doomed = predict_pruned(before, dataclasses.replace(request, namespace=namespace))
        return PruneReport(dry_run=True, removed=[e.to_json() for e in doomed],
                           ssd_removed=sum(e.tier == Tier.SSD for e in doomed),
                           freed_bytes=sum(e.bytes for e in doomed))
    counts = cache.prune(older_than_s=request.older_than_s, max_bytes=request.max_bytes, namespace=namespace,
                         tiers=request.tiers)
    remaining = {(e.tier, e.id) for e in list_entries(cache)}
    removed = [e for e in before if (e.tier, e.id) not in remaining]
    return PruneReport(dry_run=False, removed=[e.to_json() for e in removed],
                       device_freed_bytes=counts.device_freed_bytes, ssd_removed=counts.ssd_removed,
                       freed_bytes=counts.device_freed_bytes + sum(e.bytes for e in removed if e.tier == Tier.SSD))


def resolve_namespace(given: str | None, entries: list[CacheEntry]) -> str | None:
    """`cache ls` shows namespaces shortened; a unique prefix names one."""
    if given is None:
        return None
    known = {e.namespace for e in entries}
    if given in known:
        return given
    matches = sorted(n for n in known if n.startswith(given))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ControlError(NOT_FOUND, f"no cached entries in namespace `{given}`",
                           hint="`zllm cache ls` lists the namespaces")
    raise InvalidRequest(f"namespace prefix `{given}` is ambiguous: {', '.join(matches)}", param="namespace")


def predict_pruned(entries: list[CacheEntry], request: PruneRequest, now: float | None = None) -> list[CacheEntry]:
    """What a prune would remove, from the listing alone. Age follows each tier's rule (device: created,
    SSD: last used); a size bound drops least recently used entries until the tier's listed bytes fit (an
    estimate: device entries share prefix spans)."""
    now = time.time() if now is None else now
    candidates = [e for e in entries if e.tier in request.tiers]
    doomed: list[CacheEntry] = []
    if request.older_than_s is not None or request.namespace is not None:
        doomed = [e for e in candidates if (request.namespace is None or e.namespace == request.namespace)
                  and (request.older_than_s is None or now - _age_clock(e) >= request.older_than_s)]
    if request.max_bytes is not None:
        for tier in request.tiers:
            kept = sorted((e for e in candidates if e.tier == tier and e not in doomed), key=_age_clock)
            total = sum(e.bytes for e in kept)
            while kept and total > request.max_bytes:
                victim = kept.pop(0)
                total -= victim.bytes
                doomed.append(victim)
    return doomed


def _age_clock(entry: CacheEntry) -> float:
    return entry.last_used if entry.tier == Tier.SSD and entry.last_used is not None else entry.created


# ---------------------------------------------------------------------- near misses

_REPORTED = re.compile(r"near miss of (?P<entry>\S+) at token (?P<index>\d+)")


def near_miss_json(record: NearMissRecord) -> dict[str, Any]:
    return dataclasses.asdict(record)


def find_near_miss(records: list[NearMissRecord], request_id: str | None, reported: str | None) -> NearMissRecord:
    """The near-miss record of `request_id` (None: the newest). `reported` is that request's trace line
    ("near miss of <entry> at token N ..."), used when records do not carry request ids."""
    if not records:
        raise ControlError(NOT_FOUND, "no near misses recorded yet",
                           hint="a near miss is a request that shared most, but not all, of a cached prefix")
    if request_id is None:
        return records[-1]
    for record in reversed(records):
        if record.request_id == request_id:
            return record
    match = _REPORTED.search(reported or "")
    if match is not None:
        for record in reversed(records):
            if record.entry_id == match["entry"] and record.divergence == int(match["index"]):
                return record
    raise ControlError(NOT_FOUND, f"no near miss recorded for request {request_id}",
                       hint="`zllm trace --last 20` shows recent requests and which were near misses")
