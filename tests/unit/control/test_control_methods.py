"""The daemon's control methods over a real socket, with a fake engine and prefix cache behind them (small
fakes that satisfy zllm/control/served.py's protocols, as the real client and caches do)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from zllm.cache_views import CacheEntry, CacheStats, PruneCounts, SsdStats, Tier
from zllm.control.client import ControlClient
from zllm.control.methods import ControlMethods, DaemonFacts
from zllm.control.protocol import ControlError, LoadedModelInfo
from zllm.control.served import ServedCache, ServedEngine
from zllm.diagnosis.fingerprint_store import FingerprintStore
from zllm.diagnosis.records import CacheDiagnosis, RequestFingerprint
from zllm.runtime.report import RequestReport
from zllm.runtime.trace import LogHub, TraceHub

NOW = time.time()


@dataclass(frozen=True)
class FakeNearMiss:  # the fields of zllm.diagnosis.near_miss.NearMiss
    namespace: str
    entry_id: str
    tier: Tier
    divergence: int
    entry_tokens: int
    request_tokens: int
    in_prompt: bool | None = True
    before: str = "shared"
    request_after: str = "10:05"
    entry_after: str = "10:00"
    segment: str | None = "system"
    request_id: str = ""
    at: float = field(default=NOW)


class FakeCache:
    def __init__(self) -> None:
        now = time.time()  # ages are relative to the moment the cache is built (cache ls prints them)
        self.rows = [
            CacheEntry(tier=Tier.DEVICE, id="req-new", namespace="aaaa1111", tokens=300, prompt_tokens=290,
                       bytes=3000, round=2, created=now - 60, hits=4),
            CacheEntry(tier=Tier.DEVICE, id="req-old", namespace="bbbb2222", tokens=100, prompt_tokens=90,
                       bytes=1000, round=1, created=now - 7200, hits=0),
            CacheEntry(tier=Tier.SSD, id="req-old", namespace="bbbb2222", tokens=100, prompt_tokens=90,
                       bytes=5000, round=1, created=now - 7200, last_used=now - 7000, hits=1),
        ]
        self.pruned: list[dict] = []
        self.misses = [FakeNearMiss("aaaa1111", "req-a", Tier.DEVICE, 1500, 1600, 1700),
                       FakeNearMiss("aaaa1111", "req-b", Tier.SSD, 2000, 2100, 2200)]

    def stats(self) -> CacheStats:
        return CacheStats(device_bytes=4000, device_budget_bytes=16000, pool_bytes=500, entries=2, requests=10,
                          device_hits=6, ssd_hits=1, prompt_tokens=1000, cached_tokens=700, near_misses=2,
                          ssd=SsdStats(bytes=5000, budget_bytes=10000))

    def entries(self) -> list[CacheEntry]:
        return list(self.rows)

    def prune(self, **kwargs) -> PruneCounts:
        self.pruned.append(kwargs)
        gone = [r for r in self.rows if r.namespace == kwargs["namespace"] and r.tier in kwargs["tiers"]]
        self.rows = [r for r in self.rows if r not in gone]
        return PruneCounts(device_freed_bytes=sum(r.bytes for r in gone if r.tier == Tier.DEVICE),
                           ssd_removed=sum(r.tier == Tier.SSD for r in gone))

    def near_misses(self) -> list:
        return list(self.misses)


@dataclass(frozen=True)
class FakeDialectChoice:
    name: str = "hermes_json"
    reason: str = "template mentions <tool_call>"


@dataclass
class Explained:
    record: object

    def to_json(self) -> dict:
        return {"cause": "timestamp", "segment": self.record.segment}


@dataclass
class FakeEngine:  # a served.ServedEngine, as LocalEngineClient is
    prefix_cache: FakeCache | None
    queue_waiting: int = 2
    dialect_choice: FakeDialectChoice = field(default_factory=FakeDialectChoice)
    explain: Callable[[object], object] | None = Explained  # None: an engine that cannot explain a near miss
    diagnoses: Callable[[str], object] = lambda _response_id: None  # response id → (namespace, diagnosis) | None

    def explain_near_miss(self, record):
        return self.explain(record) if self.explain is not None else None

    def cache_diagnosis(self, response_id: str):
        return self.diagnoses(response_id)


def fake_engine(cache: FakeCache | None, **fields) -> FakeEngine:
    return FakeEngine(cache, **fields)


def test_the_fakes_satisfy_the_served_protocols() -> None:
    assert isinstance(fake_engine(FakeCache()), ServedEngine) and isinstance(FakeCache(), ServedCache)


@pytest.fixture()
def daemon(serve, loop_thread):
    """(control methods, client, trace hub, shutdown calls) for a daemon still loading its model."""
    trace = TraceHub(loop_thread.loop)
    logs = LogHub(loop_thread.loop)
    shutdowns: list[bool] = []
    facts = DaemonFacts(version="9.9.9", pid=4242, started_at=NOW - 5, model="tiny", http_url="http://x/v1",
                        host="127.0.0.1", port=1, socket="s", data_dir="d", log_file="l", max_queue=8)
    control = ControlMethods(facts, trace=trace, logs=logs.ring, request_shutdown=lambda: shutdowns.append(True))
    _, path = serve(control.methods(), control.streams())
    return SimpleNamespace(control=control, client=ControlClient(path), trace=trace, logs=logs,
                           shutdowns=shutdowns, loop=loop_thread)


def ready(daemon, cache: FakeCache | None = None) -> FakeCache | None:
    cache = FakeCache() if cache is None else cache
    daemon.control.attach(fake_engine(cache), LoadedModelInfo(name="tiny", parameters=1234, model_bytes=4936))
    return cache


def test_while_loading_status_says_so_and_cache_methods_are_not_ready(daemon) -> None:
    status = daemon.client.status()
    assert (status.phase, status.pid, status.model, status.version) == ("loading", 4242, "tiny", "9.9.9")
    assert status.uptime_s >= 5
    assert daemon.client.ps() == []
    with pytest.raises(ControlError) as not_ready:
        daemon.client.cache_ls()
    assert not_ready.value.code == "not_ready" and "zllm status" in not_ready.value.hint


def test_ready_status_ps_and_the_queue(daemon) -> None:
    ready(daemon)
    daemon.loop.call(daemon.trace.publish, RequestReport(phase="started", request_id="r1"))
    time.sleep(0.05)
    status = daemon.client.status()
    assert (status.phase, status.queue_waiting, status.requests_running, status.max_queue) == ("ready", 2, 1, 8)
    [model] = daemon.client.ps()
    assert (model.name, model.parameters, model.model_bytes) == ("tiny", 1234, 4936)
    assert (model.kv_cache_bytes, model.kv_cache_budget_bytes) == (4500, 16000)  # resident + working buffers
    assert (model.dialect, model.dialect_reason) == ("hermes_json", "template mentions <tool_call>")


def test_cache_ls_and_stats(daemon) -> None:
    ready(daemon)
    entries = daemon.client.cache_ls()
    assert [(e.tier, e.id, e.bytes) for e in entries] == [("device", "req-new", 3000), ("device", "req-old", 1000),
                                                          ("ssd", "req-old", 5000)]
    stats = daemon.client.cache_stats()
    assert (stats["device_fill"], stats["ssd_fill"], stats["token_hit_rate"]) == (0.25, 0.5, 0.7)
    assert (stats["device_hit_rate"], stats["ssd_hit_rate"]) == (0.6, 0.1)


def test_cache_off_is_empty_not_an_error(daemon) -> None:
    daemon.control.attach(fake_engine(None), LoadedModelInfo(name="tiny"))
    assert daemon.client.cache_ls() == [] and daemon.client.cache_stats() == {"enabled": False}
    assert daemon.client.ps()[0].kv_cache_bytes == 0


def test_prune_by_namespace_prefix_and_its_dry_run(daemon) -> None:
    cache = ready(daemon)
    dry = daemon.client.cache_prune(namespace="bbbb", dry_run=True)
    assert dry.dry_run and {(e["tier"], e["id"]) for e in dry.removed} == {("device", "req-old"), ("ssd", "req-old")}
    assert cache.pruned == [] and len(cache.rows) == 3  # a dry run touches nothing
    done = daemon.client.cache_prune(namespace="bbbb", tier="ssd")
    assert cache.pruned == [{"older_than_s": None, "max_bytes": None, "namespace": "bbbb2222", "tiers": ("ssd",)}]
    assert [(e["tier"], e["id"]) for e in done.removed] == [("ssd", "req-old")]
    assert (done.ssd_removed, done.freed_bytes) == (1, 5000)


def test_prune_dry_run_by_age_and_size_follows_each_tiers_clock(daemon) -> None:
    ready(daemon)
    old = daemon.client.cache_prune(older_than_s=3600, dry_run=True)
    assert {(e["tier"], e["id"]) for e in old.removed} == {("device", "req-old"), ("ssd", "req-old")}
    trimmed = daemon.client.cache_prune(max_bytes=3000, tier="device", dry_run=True)
    assert [e["id"] for e in trimmed.removed] == ["req-old"]  # least recently created goes first


def test_prune_refuses_vague_or_malformed_requests(daemon) -> None:
    ready(daemon)
    for params, code in [({}, "invalid_request"), ({"tier": "ram", "older_than_s": 1}, "invalid_request"),
                         ({"max_bytes": -1}, "invalid_request"), ({"namespace": "zzz"}, "not_found")]:
        with pytest.raises(ControlError) as refused:
            daemon.client.call("cache.prune", **params)
        assert refused.value.code == code, params


def test_explain_latest_and_by_request_id(daemon) -> None:
    ready(daemon)
    latest = daemon.client.explain()
    assert latest["near_miss"]["entry_id"] == "req-b"
    assert latest["explanation"] == {"cause": "timestamp", "segment": "system"}
    daemon.loop.call(daemon.trace.publish, RequestReport(
        phase="finished", request_id="chat-7", near_miss="near miss of req-a at token 1500 in system"))
    time.sleep(0.05)
    assert daemon.client.explain("chat-7")["near_miss"]["entry_id"] == "req-a"
    with pytest.raises(ControlError) as unknown:
        daemon.client.explain("chat-unknown")
    assert unknown.value.code == "not_found" and "zllm trace" in unknown.value.hint


def test_explain_with_no_near_misses_says_so(daemon) -> None:
    cache = ready(daemon)
    cache.misses = []
    with pytest.raises(ControlError) as none:
        daemon.client.explain()
    assert none.value.code == "not_found" and "no near misses" in none.value.message


def test_a_responses_cache_diagnosis_by_id(daemon) -> None:
    store = FingerprintStore.in_memory()
    fingerprint = RequestFingerprint(model="m", system="", tools=(), messages=("u",), roles=("user",), options={},
                                     prompt_ids=(1, 2, 3))
    store.save(fingerprint.with_response("msg_2", "ns"))
    store.save_diagnosis("msg_2", "ns", CacheDiagnosis("system", "msg_1", missed_tokens=2, reusable_tokens=3))
    daemon.control.attach(fake_engine(FakeCache(), diagnoses=store.diagnosis), LoadedModelInfo(name="tiny"))
    answer = daemon.client.diagnosis("msg_2")
    assert (answer["namespace"], answer["diagnosis"]["reason"], answer["diagnosis"]["missed_tokens"]) == (
        "ns", "system", 2)
    with pytest.raises(ControlError) as unknown:
        daemon.client.diagnosis("msg_unknown")
    assert unknown.value.code == "not_found" and "previous_message_id" in unknown.value.hint


def test_trace_replays_recent_finished_requests_then_follows(daemon) -> None:
    ready(daemon)
    for i in range(3):
        daemon.loop.call(daemon.trace.publish, RequestReport(phase="finished", request_id=f"old-{i}"))
    time.sleep(0.05)
    assert [r["request_id"] for r in daemon.client.trace(last=2)] == ["old-1", "old-2"]
    live = daemon.client.trace(last=1, follow=True)
    assert next(live)["request_id"] == "old-2"
    daemon.loop.call(daemon.trace.publish, RequestReport(phase="started", request_id="new"))
    assert (lambda r: (r["phase"], r["request_id"]))(next(live)) == ("started", "new")
    live.close()


def test_following_trace_starts_with_the_requests_under_way(daemon) -> None:
    ready(daemon)
    daemon.loop.call(daemon.trace.publish, RequestReport(phase="finished", request_id="old"))
    for done in (0, 512, 1024):  # the newest progress report only
        daemon.loop.call(daemon.trace.publish, RequestReport(phase="prefilling", request_id="long",
                                                             prompt_tokens=4096, prefilled_tokens=done))
    daemon.loop.call(daemon.trace.publish, RequestReport(phase="started", request_id="short"))
    time.sleep(0.05)
    live = daemon.client.trace(last=1, follow=True)
    seen = [(r["phase"], r["request_id"], r["prefilled_tokens"]) for r in (next(live) for _ in range(3))]
    assert seen == [("finished", "old", 0), ("prefilling", "long", 1024), ("started", "short", 0)]
    live.close()
    assert [r["request_id"] for r in daemon.client.trace(last=5)] == ["old"]  # not following: finished ones only
    status = daemon.client.status()
    assert (status.requests_running, status.requests_prefilling) == (1, 1)
    assert [(p["request_id"], p["prefilled_tokens"], p["prompt_tokens"]) for p in status.prefilling] == [
        ("long", 1024, 4096)]


def test_logs_stream_formatted_lines(daemon) -> None:
    import logging

    logger = logging.getLogger("zllm.test-control")
    logger.addHandler(daemon.logs)
    logger.setLevel(logging.INFO)
    try:
        logger.info("hello %s", "world")
        time.sleep(0.05)
        [line] = list(daemon.client.logs(last=5))
    finally:
        logger.removeHandler(daemon.logs)
    assert line.endswith("INFO zllm.test-control: hello world")


def test_shutdown_answers_then_stops(daemon) -> None:
    daemon.client.shutdown()
    time.sleep(0.05)
    assert daemon.shutdowns == [True] and daemon.client.status().phase == "stopping"
