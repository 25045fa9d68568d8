"""The near-miss rules pinned at their defaults, on both caches and both tiers.

A request is a near miss of a cached sequence when it shares at least 1024 leading tokens *and* more than
90% of that sequence, then goes on differently. Each rule is tested one token either side of its edge —
1023 vs 1024 shared tokens (where the fraction rule holds), exactly 90% vs just over (where the count rule
holds) — on the device tier and on the SSD tier after a restart (a new cache over the same directory, the
device tier empty). `PrefixCache` (the torch backend's cache) runs on synthetic KV; `SequencePrefixCache`
(the llama.cpp backend's) on a real engine with a tiny random-weight GGUF.
"""

from __future__ import annotations

import importlib.util
import random

import pytest

from tests.unit.kvcache.test_kv_prefix_cache import make_cache, serve
from zllm.kvcache import CacheConfig

EDITED = 4095  # a token no random_tokens draw makes at the divergence, so the prefix ends exactly there

# (cached sequence length, tokens shared before the edit, whether that is a near miss)
COUNT_EDGE = [(1100, 1023, False), (1100, 1024, True)]  # 1023/1100 and 1024/1100 are both over 90%
FRACTION_EDGE = [(1140, 1026, False), (1140, 1027, True)]  # 1026 = exactly 90% of 1140; both over 1024
CASES = COUNT_EDGE + FRACTION_EDGE


def test_the_defaults_are_the_ones_pinned_here() -> None:
    config = CacheConfig(device_budget_bytes=1)
    assert (config.near_miss_min_tokens, config.near_miss_fraction) == (1024, 0.9)


def sequence(length: int, seed: int = 0) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(30, 4000) for _ in range(length))


def edited(cached: tuple[int, ...], shared: int) -> tuple[int, ...]:
    assert cached[shared] != EDITED
    return cached[:shared] + (EDITED,) + cached[shared + 1:]


def assert_recorded(misses, expected: bool, *, entry_id: str, tier: str, shared: int) -> None:
    if not expected:
        assert misses == []
        return
    (miss,) = misses
    assert (miss.entry_id, miss.tier, miss.divergence, miss.in_prompt) == (entry_id, tier, shared, True)


# ---------------------------------------------------------------- PrefixCache (torch backend)


@pytest.mark.parametrize("length,shared,expected", CASES)
def test_prefix_cache_device_tier(length, shared, expected) -> None:
    cache = make_cache()
    cached = sequence(length)
    serve(cache, cached, rid="orig")
    lease = serve(cache, edited(cached, shared), rid="edit")
    assert lease.cached_tokens == shared
    assert_recorded(cache.near_misses(), expected, entry_id="orig", tier="device", shared=shared)


@pytest.mark.parametrize("length,shared,expected", CASES)
def test_prefix_cache_ssd_tier_after_a_restart(tmp_path, length, shared, expected) -> None:
    cache = make_cache(tmp_path)
    cached = sequence(length)
    serve(cache, cached, rid="orig")
    cache.flush()
    cache.close()
    restarted = make_cache(tmp_path)
    try:
        lease = serve(restarted, edited(cached, shared), rid="edit")
        assert (lease.tier, lease.cached_tokens) == ("ssd", shared)
        assert_recorded(restarted.near_misses(), expected, entry_id="orig", tier="ssd", shared=shared)
    finally:
        restarted.close()


# ---------------------------------------------------------------- SequencePrefixCache (llama.cpp backend)

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                 reason="the llama.cpp backend is not installed")


@pytest.fixture
def gguf(tiny_gguf_path):
    return tiny_gguf_path("llama-bpe")


def sequence_run(engine, cache, prompt, rid):
    from zllm.engine.contract import Row

    lease = cache.acquire("ns", prompt, max_new_tokens=1, request_id=rid)
    seq = engine.open(lease)
    engine.step([Row(seq, prompt[lease.cached_tokens:])])
    cache.finish(lease, prompt, seq, entry_id=rid, prompt_length=len(prompt))
    return lease


def new_sequence_cache(engine, ssd_dir=None):
    from zllm.kvcache.sequence_cache import SequencePrefixCache

    config = CacheConfig(device_budget_bytes=engine.kv_bytes, ssd_dir=ssd_dir, ssd_min_tokens=16)
    return SequencePrefixCache(config, engine, cells=engine.cells, bytes_per_token=engine.bytes_per_token,
                               layout="tiny", spare_sequences=2)


def new_engine(path):
    from zllm.engine.llamacpp.backend import ContextSettings, LlamaCppEngine

    return LlamaCppEngine(str(path), ContextSettings(cells=4096, threads=1, max_sequences=8))


@needs_llama
@pytest.mark.parametrize("length,shared,expected", CASES)
def test_sequence_cache_device_tier(gguf, length, shared, expected) -> None:
    engine = new_engine(gguf)
    try:
        cache = new_sequence_cache(engine)
        cached = sequence(length)
        sequence_run(engine, cache, cached, "orig")
        lease = sequence_run(engine, cache, edited(cached, shared), "edit")
        assert (lease.tier, lease.cached_tokens) == ("device", shared)
        assert_recorded(cache.near_misses(), expected, entry_id="orig", tier="device", shared=shared)
        cache.close()
    finally:
        engine.close()


@needs_llama
@pytest.mark.parametrize("length,shared,expected", CASES)
def test_sequence_cache_ssd_tier_after_a_restart(gguf, tmp_path, length, shared, expected) -> None:
    cached = sequence(length)
    engine = new_engine(gguf)
    try:
        cache = new_sequence_cache(engine, tmp_path / "kv")
        sequence_run(engine, cache, cached, "orig")
        cache.close()  # waits for the writer
    finally:
        engine.close()
    restarted = new_engine(gguf)
    try:
        cache = new_sequence_cache(restarted, tmp_path / "kv")
        lease = sequence_run(restarted, cache, edited(cached, shared), "edit")
        assert (lease.tier, lease.cached_tokens) == ("ssd", shared)
        assert_recorded(cache.near_misses(), expected, entry_id="orig", tier="ssd", shared=shared)
        cache.close()
    finally:
        restarted.close()
