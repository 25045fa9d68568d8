"""The main-conversation rule (kvcache/retention.py): the rule itself, and the tiers that choose their victims by
it — the one device tier (on torch's KV here) and the one SSD store, with both backends' payloads (on llama.cpp's
KV: tests/unit/runtime/test_main_conversation_kept.py, on a real engine)."""

import random

from tests.unit.kvcache.conftest import keep, random_tokens, torch_cache, torch_job, torch_store
from zllm.kvcache.retention import LIVE_S, Newcomer, main_conversations, next_eviction
from zllm.kvcache.snapshot_store import SnapshotJob, SnapshotStore

BPT = 512  # bytes per token of the synthetic layout
NS = "ns"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def kept(namespace=NS, length=100, round_=1, hits=0, last_used=0.0) -> Newcomer:
    return Newcomer(namespace, length, round_, last_used, hits)


def test_a_continued_conversation_is_the_main_one_over_a_longer_one_off() -> None:
    subagent = kept(length=900, last_used=10)  # one long request, never continued
    main = kept(length=600, round_=3, last_used=5)
    title = kept(length=40, last_used=20)
    other = kept(namespace="other", length=50, last_used=1)
    assert main_conversations([subagent, main, title, other], now=30) == {NS: main, "other": other}
    # with nothing continued yet (a session's first turn), the longest is the main one
    assert main_conversations([subagent, title], now=30) == {NS: subagent}
    # a conversation idle past the live window protects nothing
    assert main_conversations([main, title], now=5 + LIVE_S + 1) == {NS: title}


def test_eviction_takes_side_states_first_and_says_what_it_spared() -> None:
    main, side1, side2 = kept(length=600, round_=2, last_used=1), kept(last_used=2), kept(last_used=3)
    states = [main, side1, side2]
    eviction = next_eviction(states, states, now=10)
    assert eviction.victim is side1 and eviction.spared is main  # LRU would have taken main
    assert next_eviction([side2], states, now=10).victim is side2
    # only main conversations left: the oldest goes (a running request must get its room) ...
    assert next_eviction([main], states, now=10).victim is main
    # ... but a side request's state asking for room does not take it, while the next turn of main does
    assert next_eviction([main], states, now=10, newcomer=kept(length=50, last_used=10)).victim is None
    next_turn = kept(length=700, round_=3, last_used=10)
    assert next_eviction([main], states, now=10, newcomer=next_turn).victim is main


def test_the_device_tier_keeps_the_main_conversation_and_refuses_a_side_state_that_needs_it() -> None:
    cache = torch_cache(600 * BPT, clock=Clock())
    entries = cache.graph.entries
    main_tokens = random_tokens(400, random.Random(0))
    keep(cache, main_tokens, "main")
    cache.graph.touch(entries["main"])  # its next turn reused it: a continued conversation
    for i in range(5):
        keep(cache, random_tokens(80, random.Random(i + 1)), f"side{i}")
        assert "main" in entries and cache.kv.held_bytes() <= cache.budget_bytes
        cache.check_integrity()
    assert set(entries) == {"main", "side3", "side4"}  # the older side states made room
    big = random_tokens(300, random.Random(9))  # fits only in main's place: not kept
    assert keep(cache, big, "big") is None
    assert "main" in entries


def test_the_torch_ssd_tier_evicts_side_snapshots_before_the_main_conversation(tmp_path) -> None:
    rng = random.Random(4)
    store = torch_store(tmp_path / "kv")
    main = random_tokens(400, rng)
    store.commit(torch_job("main", main, round_=2))
    for i in range(4):
        store.commit(torch_job(f"side{i}", random_tokens(60, rng)))
    assert store.evict_to_budget(store.total_bytes - 1) == ["side0"]  # LRU alone: main
    assert "main" in {r.id for r in store.snapshots()}
    store.close()


def test_the_llamacpp_ssd_tier_evicts_side_snapshots_before_the_main_conversation(tmp_path) -> None:
    rng = random.Random(5)
    store = SnapshotStore(tmp_path / "kv-llamacpp", "layout", 1 << 30)
    store.commit(SnapshotJob("main", NS, "model", random_tokens(400, rng), 400, 2, lambda: bytes(4000)))
    for i in range(4):
        store.commit(SnapshotJob(f"side{i}", NS, "model", random_tokens(60, rng), 60, 1, lambda: bytes(600)))
    store.budget_bytes = sum(r.nbytes for r in store.snapshots()) - 1
    store.commit(SnapshotJob("side4", NS, "model", random_tokens(60, rng), 60, 1, lambda: bytes(600)))
    ids = {r.id for r in store.snapshots()}
    assert "main" in ids and "side0" not in ids
    store.close()
