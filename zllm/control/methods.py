"""The daemon's control methods (protocol.py lists the wire format), over objects the daemon injects.

    control = ControlMethods(facts, trace=hub, logs=log_hub.ring, request_shutdown=stop.set)
    server = ControlServer(path, version=..., methods=control.methods(), streams=control.streams())
    control.attach(engine, model_info)    # once the model is loaded: phase "loading" → "ready"

    status            → DaemonStatus (with each prefilling request's progress: PrefillProgress)
    ps                → {"models": [LoadedModelInfo]}        (empty while loading; with the measured prefill
                                                              rate: prefill_rate.py)
    cache.*           → cache_methods.py
    cache.explain     {"request_id": "chatcmpl-…" | null} → {"request_id", "near_miss", "explanation"}: the
                      engine's explanation of its near-miss record (ServedEngine.explain_near_miss)
    store.stats       → the Responses store: {"path", "rows", "bytes", "file_bytes", "oldest", "newest", bounds}
    store.prune       {"older_than_s": 86400 | null, "max_bytes": 0 | null} → {"removed": N, ...store.stats}
    cache.diagnosis   {"response_id": "msg_…" | "resp_…"} → {"response_id", "namespace", "diagnosis"}: the cache
                      diagnosis that response carried (ServedEngine.cache_diagnosis); not_found when none was made
    trace (stream)    {"last": 20, "follow": false} → RequestReport JSON items (following: then the newest report
                      of each unfinished request, then every report as it comes)
    logs (stream)     {"last": 100, "follow": false} → {"line": "..."} items
    shutdown          → {"stopping": true}                    (the reply goes out before the daemon stops)

No torch and no runtime imports: the engine is used only as a `served.ServedEngine` (LocalEngineClient is
the production one), its prefix cache as a `served.ServedCache`, so this layer can be tested with small fakes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from zllm.control import cache_methods
from zllm.control.params import bool_param, float_param, int_param, str_param
from zllm.control.prefill_rate import RECENT, measured_prefill_rate
from zllm.control.protocol import (
    BAD_REQUEST,
    NOT_FOUND,
    NOT_READY,
    ControlError,
    DaemonStatus,
    LoadedModelInfo,
    PrefillProgress,
)
from zllm.control.served import ServedCache, ServedEngine
from zllm.errors import InvalidRequest


@dataclass(frozen=True)
class DaemonFacts:
    """What the daemon knows about itself before the model loads."""

    version: str
    pid: int
    started_at: float
    model: str
    http_url: str
    host: str
    port: int
    socket: str
    data_dir: str
    log_file: str
    max_queue: int


class ControlMethods:
    def __init__(self, facts: DaemonFacts, *, trace, logs, request_shutdown: Callable[[], None]):
        """`trace`: a TraceHub; `logs`: a BroadcastRing of log lines."""
        self.facts = facts
        self.phase = "loading"
        self._trace = trace
        self._logs = logs
        self._request_shutdown = request_shutdown
        self._engine: ServedEngine | None = None
        self._model: LoadedModelInfo | None = None
        self._responses = None

    def attach_responses(self, store) -> None:
        """The Responses store (zllm.store.ResponseStore: stats / prune / compact), open before the model loads."""
        self._responses = store

    def attach(self, engine: ServedEngine, model: LoadedModelInfo) -> None:
        self._engine, self._model, self.phase = engine, model, "ready"

    def methods(self) -> dict[str, Callable]:
        return {"status": self.status, "ps": self.ps, "cache.ls": self.cache_ls, "cache.stats": self.cache_stats,
                "cache.prune": self.cache_prune, "cache.near_misses": self.cache_near_misses,
                "cache.explain": self.cache_explain, "cache.diagnosis": self.cache_diagnosis,
                "store.stats": self.store_stats, "store.prune": self.store_prune,
                "shutdown": self.shutdown}

    def streams(self) -> dict[str, Callable]:
        return {"trace": self.trace, "logs": self.logs}

    # ------------------------------------------------------------------ daemon

    async def status(self, params: dict) -> dict:
        f = self.facts
        engine = self._engine
        prefilling = [PrefillProgress.from_json(report.to_json()) for report in self._trace.prefilling()]
        return DaemonStatus(
            version=f.version, pid=f.pid, phase=self.phase, started_at=f.started_at,
            uptime_s=time.time() - f.started_at, model=f.model, http_url=f.http_url, host=f.host, port=f.port,
            queue_waiting=engine.queue_waiting if engine is not None else 0, requests_running=self._trace.running,
            max_queue=f.max_queue, socket=f.socket, data_dir=f.data_dir, log_file=f.log_file,
            requests_prefilling=len(prefilling), prefilling=[p.to_json() for p in prefilling],
        ).to_json()

    async def ps(self, params: dict) -> dict:
        if self._model is None:
            return {"models": []}
        model = self._model
        cache = self._engine.prefix_cache
        cost_s_per_token = None
        if cache is not None:
            stats = await asyncio.to_thread(cache.stats)
            model = replace(model, kv_cache_bytes=stats.device_bytes + stats.pool_bytes,
                            kv_cache_budget_bytes=stats.device_budget_bytes)
            cost_s_per_token = stats.prefill_s_per_token
        rate = measured_prefill_rate(self._trace.recent(RECENT), cost_s_per_token=cost_s_per_token)
        model = replace(model, prefill_tokens_per_s=rate)
        choice = self._engine.dialect_choice
        model = replace(model, resident_bytes=resident_bytes(), dialect=choice.name, dialect_reason=choice.reason)
        return {"models": [model.to_json()]}

    async def shutdown(self, params: dict) -> dict:
        self.phase = "stopping"
        asyncio.get_running_loop().call_soon(self._request_shutdown)  # after this reply is written
        return {"stopping": True}

    # ------------------------------------------------------------------ cache

    async def cache_ls(self, params: dict) -> dict:
        cache = self._cache()
        return await asyncio.to_thread(cache_methods.entries_json, cache) if cache is not None else {"entries": []}

    async def cache_stats(self, params: dict) -> dict:
        return await asyncio.to_thread(cache_methods.stats_json, self._cache())

    async def cache_prune(self, params: dict) -> dict:
        request = cache_methods.PruneRequest.from_params(params)
        cache = self._cache()
        if cache is None:
            return {"dry_run": request.dry_run, "removed": []}
        return (await asyncio.to_thread(cache_methods.prune, cache, request)).to_json()

    async def cache_near_misses(self, params: dict) -> dict:
        cache = self._cache()
        records = cache.near_misses() if cache is not None else []
        return {"near_misses": [cache_methods.near_miss_json(r) for r in records]}

    async def cache_explain(self, params: dict) -> dict:
        request_id = str_param(params, "request_id")
        cache = self._cache()
        reported = self._trace.find(request_id) if request_id else None
        record = cache_methods.find_near_miss(cache.near_misses() if cache is not None else [], request_id,
                                              reported.near_miss if reported is not None else None)
        explanation = await asyncio.to_thread(self._engine.explain_near_miss, record)
        return {"request_id": request_id, "near_miss": cache_methods.near_miss_json(record),
                "explanation": explanation.to_json() if explanation is not None else None}

    async def cache_diagnosis(self, params: dict) -> dict:
        response_id = str_param(params, "response_id")
        if not response_id:
            raise ControlError(BAD_REQUEST, "`response_id` is required")
        found = await asyncio.to_thread(self._ready().cache_diagnosis, response_id)
        if found is None:
            raise ControlError(NOT_FOUND, f"no cache diagnosis is kept for {response_id}",
                               hint="diagnoses are made for requests that send Anthropic `diagnostics."
                                    "previous_message_id` or Responses `prompt_cache_options.comparison_response_id`")
        namespace, diagnosis = found
        return {"response_id": response_id, "namespace": namespace, "diagnosis": diagnosis.to_json()}

    def _cache(self) -> ServedCache | None:
        return self._ready().prefix_cache

    def _ready(self) -> ServedEngine:
        if self._engine is None:
            raise ControlError(NOT_READY, "the daemon is still loading its model",
                               hint="wait until `zllm status` says ready")
        return self._engine

    # ------------------------------------------------------------------ Responses store

    async def store_stats(self, params: dict) -> dict:
        return await asyncio.to_thread(self._store().stats)

    async def store_prune(self, params: dict) -> dict:
        """Older than `older_than_s` and/or down to `max_bytes` (0 = everything), then the file compacted."""
        older_than_s, max_bytes = float_param(params, "older_than_s"), int_param(params, "max_bytes", None)
        if older_than_s is None and max_bytes is None:
            raise InvalidRequest("give `older_than_s` and/or `max_bytes`")
        store = self._store()

        def prune() -> dict:
            removed = store.prune(older_than_s=older_than_s, max_bytes=max_bytes)
            store.compact()
            return {"removed": removed, **store.stats()}

        return await asyncio.to_thread(prune)

    def _store(self):
        if self._responses is None:
            raise ControlError(NOT_READY, "the daemon has not opened its Responses store yet",
                               hint="wait until `zllm status` says ready")
        return self._responses

    # ------------------------------------------------------------------ streams

    async def trace(self, params: dict) -> AsyncIterator[dict]:
        last, follow = int_param(params, "last", 20), bool_param(params, "follow")
        with self._trace.subscribe() as feed:  # before reading the ring: nothing falls between the two
            for report in self._trace.recent(last):
                yield report.to_json()
            if follow:  # then what is under way now (prefilling, generating), as its newest report says
                for report in self._trace.live():
                    yield report.to_json()
            while follow:
                yield (await feed.get()).to_json()

    async def logs(self, params: dict) -> AsyncIterator[dict]:
        last, follow = int_param(params, "last", 100), bool_param(params, "follow")
        with self._logs.subscribe() as feed:
            for line in self._logs.recent(last):
                yield {"line": line}
            while follow:
                yield {"line": await feed.get()}


def resident_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
