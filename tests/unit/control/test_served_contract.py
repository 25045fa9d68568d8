"""The control methods over the real served engine (the tiny model on torch and on llama.cpp), on a real socket:
LocalEngineClient and both prefix caches satisfy zllm/control/served.py's protocols, and the JSON keys users
see in `zllm cache stats --json`, `cache ls --json`, `ps` and `status` are the ones they always were."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.backends import BACKENDS, load_tiny
from zllm.cache_views import CacheEntry, CacheStats, SsdStats, Tier
from zllm.canonical import ChatRequest, Finished, Message, SamplingParams
from zllm.control.client import ControlClient
from zllm.control.methods import ControlMethods, DaemonFacts
from zllm.control.protocol import LoadedModelInfo
from zllm.control.served import ServedCache, ServedEngine
from zllm.kvcache import CacheConfig
from zllm.runtime.client import LocalEngineClient
from zllm.runtime.trace import LogHub, TraceHub

MODEL = "tiny"
BASE_KEYS = {"enabled", "device_bytes", "device_budget_bytes", "pool_bytes", "pool_in_use_bytes", "retained_bytes",
             "entries", "nodes", "namespaces", "requests", "prompt_tokens", "cached_tokens", "device_hits",
             "ssd_hits", "ssd_not_worth_it", "ssd_rejected", "kept", "not_kept", "near_misses",
             "prefill_s_per_token", "restore_s_per_byte", "restore_s_fixed", "device_fill", "ssd_fill", "device_hit_rate",
             "ssd_hit_rate", "token_hit_rate", "main_spared"}
_ONE_STORE_KEYS = {"ssd_snapshots", "ssd_bytes", "ssd_budget_bytes", "ssd_quarantined", "ssd_index_set_aside",
                   "ssd_strays", "ssd_dropped_jobs", "ssd_writes", "ssd_writes_skipped", "ssd_restores", "ssd_evicted",
                   "ssd_superseded"}
SSD_KEYS = {"torch": _ONE_STORE_KEYS, "llamacpp": _ONE_STORE_KEYS}  # one SSD store: the same counters on both
# `zllm status --json` (and what `zllm claude` reads); `prefilling` items: one per request still prefilling
STATUS_KEYS = {"version", "pid", "phase", "started_at", "uptime_s", "model", "http_url", "host", "port",
               "queue_waiting", "requests_running", "max_queue", "socket", "data_dir", "log_file",
               "requests_prefilling", "prefilling"}
PREFILL_KEYS = {"request_id", "api", "prompt_tokens", "prefilled_tokens", "cached_tokens", "at"}
ENTRY_KEYS = {"tier", "id", "namespace", "tokens", "prompt_tokens", "bytes", "round", "hits", "created", "last_used"}


@pytest.fixture(params=BACKENDS)
def served(request, tmp_path):
    """(backend, a LocalEngineClient with a device and an SSD tier, that has answered one request)."""
    loaded = load_tiny("qwen3", request.param, context_length=512)
    budget = loaded.device_cache_budget(16)  # llama.cpp: its KV pool, sized at load
    config = CacheConfig(device_budget_bytes=budget, ssd_dir=tmp_path / "kv", ssd_min_tokens=1)
    client = LocalEngineClient(loaded, MODEL, 1, cache_config=config, owns_engine=True)
    try:
        ask(client, "r1")
        settle(client.prefix_cache)
        yield request.param, client
    finally:
        client.close()


def ask(client: LocalEngineClient, rid: str) -> Finished:
    request = ChatRequest(id=rid, model=MODEL, messages=(Message("user", "Write a function"),),
                          sampling=SamplingParams(temperature=0.0, max_tokens=4))

    async def main() -> Finished:
        return [event async for event in await client.submit(request)][-1]

    return asyncio.run(asyncio.wait_for(main(), timeout=60))


def settle(cache) -> None:
    """Until the engine thread has retired the request (Finished reaches the stream before the cache keeps its
    state) and the SSD writer has written its snapshot."""
    deadline = time.monotonic() + 30
    while not retired(cache.stats()):
        assert time.monotonic() < deadline, "the request was never retired"
        time.sleep(0.01)
    cache.flush()


def retired(stats: CacheStats) -> bool:
    return stats.kept + stats.not_kept > 0


def control_over(client: LocalEngineClient, serve, loop_thread) -> ControlClient:
    facts = DaemonFacts(version="9.9.9", pid=1, started_at=time.time(), model=MODEL, http_url="", host="", port=0,
                        socket="", data_dir="", log_file="", max_queue=8)
    control = ControlMethods(facts, trace=TraceHub(loop_thread.loop), logs=LogHub(loop_thread.loop).ring,
                             request_shutdown=lambda: None)
    control.attach(client, LoadedModelInfo(name=MODEL))
    _, path = serve(control.methods(), control.streams())
    return ControlClient(path)


def test_the_real_engine_satisfies_the_served_protocols_and_keeps_the_json_keys(served, serve, loop_thread) -> None:
    """One test per backend: loading the model is most of its time."""
    backend, client = served
    assert isinstance(client, ServedEngine) and isinstance(client.prefix_cache, ServedCache)
    stats = client.prefix_cache.stats()
    assert isinstance(stats, CacheStats) and isinstance(stats.ssd, SsdStats)
    assert (stats.requests, stats.kept, stats.ssd.snapshots) == (1, 1, 1)
    entries = client.prefix_cache.entries()
    assert all(isinstance(e, CacheEntry) for e in entries)
    assert [e.tier for e in entries] == [Tier.DEVICE, Tier.SSD] and {e.id for e in entries} == {"r1"}
    assert_control_answers_keep_their_keys(backend, client, control_over(client, serve, loop_thread))


def assert_control_answers_keep_their_keys(backend: str, client: LocalEngineClient, control: ControlClient) -> None:
    stats = control.cache_stats()
    assert set(stats) == BASE_KEYS | SSD_KEYS[backend]
    assert (stats["enabled"], stats["requests"], stats["kept"], stats["ssd_snapshots"]) == (True, 1, 1, 1)
    assert stats["device_fill"] == stats["device_bytes"] / stats["device_budget_bytes"] > 0
    assert CacheStats.from_json(stats) == client.prefix_cache.stats(), "the CLI reads back what the cache said"
    listing = control.call("cache.ls")["entries"]
    assert [set(e) for e in listing] == [ENTRY_KEYS, ENTRY_KEYS]
    assert [(e["tier"], e["id"]) for e in listing] == [("device", "r1"), ("ssd", "r1")]
    [model] = control.ps()
    assert model.dialect == client.dialect_choice.name and model.dialect_reason == client.dialect_choice.reason
    assert client.dialect_check.held, client.dialect_check.problem  # the load-time round trip
    assert model.kv_cache_budget_bytes == stats["device_budget_bytes"] > 0
    assert control.status().queue_waiting == 0
    status = control.call("status")
    assert set(status) == STATUS_KEYS and (status["requests_prefilling"], status["prefilling"]) == (0, [])
    pruned = control.cache_prune(older_than_s=0, tier="ssd")
    assert (pruned.ssd_removed, [e["tier"] for e in pruned.removed]) == (1, ["ssd"])


def test_cache_stats_json_round_trips_and_says_why_an_ssd_tier_is_off() -> None:
    stats = CacheStats(device_bytes=10, device_budget_bytes=40, requests=4, device_hits=3, ssd_hits=1,
                       ssd=SsdStats(snapshots=2, bytes=5, budget_bytes=20, writes=3))
    data = stats.to_json()
    assert (data["device_fill"], data["ssd_fill"], data["device_hit_rate"], data["ssd_writes"]) == (0.25, 0.25, 0.75, 3)
    assert "ssd_restores" not in data and "ssd_off" not in data  # a counter the store does not keep is left out
    assert CacheStats.from_json(data) == stats and stats.cold == 0
    off = CacheStats(ssd_off="index.sqlite is locked by another process").to_json()
    assert off["ssd_off"].startswith("index.sqlite") and off["ssd_fill"] is None and "ssd_bytes" not in off
    assert CacheStats.from_json({"device_bytes": 1, "a_newer_daemons_key": 7}) == CacheStats(device_bytes=1)


def test_tier_words_are_the_ones_logs_and_json_always_had() -> None:
    assert [str(t) for t in Tier] == ["cold", "device", "device-hint", "ssd", "ssd-hint"]
    assert Tier.hit(Tier.DEVICE, True) is Tier.DEVICE_HINT and Tier.hit(Tier.SSD, False) is Tier.SSD
    assert Tier.DEVICE_HINT.on_device and not Tier.SSD_HINT.on_device and Tier.SSD_HINT.from_ssd
    assert CacheEntry.from_json({"tier": "ssd", "id": "x", "namespace": "n", "tokens": 3}).tier is Tier.SSD


def test_a_prefilling_request_in_status_keeps_its_keys(serve, loop_thread) -> None:
    from zllm.runtime.report import RequestReport

    facts = DaemonFacts(version="9.9.9", pid=1, started_at=time.time(), model=MODEL, http_url="", host="", port=0,
                        socket="", data_dir="", log_file="", max_queue=8)
    trace = TraceHub(loop_thread.loop)
    control = ControlMethods(facts, trace=trace, logs=LogHub(loop_thread.loop).ring, request_shutdown=lambda: None)
    _, path = serve(control.methods(), control.streams())
    loop_thread.call(trace.publish, RequestReport(phase="prefilling", request_id="msg_1", prompt_tokens=900,
                                                  prefilled_tokens=300, cached_tokens=100))
    loop_thread.call(lambda: None)  # the publish has landed on the loop
    status = ControlClient(path).call("status")
    assert set(status) == STATUS_KEYS and status["requests_prefilling"] == 1
    assert [set(item) for item in status["prefilling"]] == [PREFILL_KEYS]
