"""The one prefix cache over `RemoteKV` (engine/vllm/kv.py): zllm's index of what it sent vLLM holds no KV, but
hits, near misses, eviction by the budget and lease bookkeeping behave as on the local engines."""

from __future__ import annotations

from zllm.cache_views import Tier
from zllm.engine.vllm.kv import RemoteKV, kv_bytes_per_token
from zllm.kvcache import CacheConfig
from zllm.kvcache.prefix_cache import PrefixCache

BPT = 100


def index(budget_tokens: int = 10_000, **config) -> PrefixCache:
    return PrefixCache(CacheConfig(device_budget_bytes=budget_tokens * BPT, near_miss_min_tokens=8, **config),
                       RemoteKV(BPT), cost_key="vllm")


def test_a_continuation_hits_and_the_sequence_is_listed() -> None:
    cache = index()
    first = cache.acquire("ns", range(40), max_new_tokens=8)
    assert first.cached_tokens == 0 and cache.kv.reserved_bytes() > 0
    assert cache.finish(first, [*range(40), 7, 8], None, entry_id="a", prompt_length=40)
    assert cache.kv.reserved_bytes() == 0  # the request's room is given back
    second = cache.acquire("ns", [*range(40), 7, 8, 9, 10])
    assert second.cached_tokens == 42 and second.tier == Tier.DEVICE
    cache.release(second)
    [entry] = cache.entries()
    assert (entry.id, entry.tokens, entry.bytes) == ("a", 42, 42 * BPT)
    assert cache.acquire("other", range(40)).cached_tokens == 0  # namespaces never share


def test_a_diverging_request_is_a_near_miss() -> None:
    cache = index()
    cache.finish(cache.acquire("ns", range(30)), range(32), None, entry_id="a", prompt_length=30)
    lease = cache.acquire("ns", [*range(29), 99, 100], request_id="b",
                          describe_position=lambda i: "message 1 (user)")
    record = cache.near_misses()[-1]
    assert lease.near_miss is record
    assert (record.entry_id, record.divergence, record.segment, record.request_id) == ("a", 29, "message 1 (user)", "b")


def test_a_failed_request_leaves_nothing_and_the_budget_evicts() -> None:
    cache = index(budget_tokens=100)
    cache.release(cache.acquire("ns", range(50)))
    assert cache.entries() == [] and cache.kv.reserved_bytes() == 0
    cache.finish(cache.acquire("ns", range(60)), range(60), None, entry_id="a", prompt_length=60)
    cache.finish(cache.acquire("ns", range(100, 160)), range(100, 160), None, entry_id="b", prompt_length=60)
    assert [e.id for e in cache.entries()] == ["b"]  # 120 tokens do not fit 100: the older one went
    cache.check_integrity()


def test_bytes_per_token_from_the_model_config() -> None:
    smollm2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    assert kv_bytes_per_token(smollm2) == 2 * 30 * 3 * 64 * 2
    assert kv_bytes_per_token({}) == 1
