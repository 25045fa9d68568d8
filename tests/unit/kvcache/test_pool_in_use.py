"""Leak accounting: `BufferPool.in_use_bytes` and the `pool_in_use_bytes` / `retained_bytes` cache stats.

The load test (tests/integration/test_load.py) reads these over the control socket after clients disconnect;
here they are checked against the pool and the tier directly.
"""

import random

from tests.unit.kvcache.conftest import LAYOUT, assert_state_equal, random_tokens, synthetic_state, torch_cache
from zllm.engine.torch.cache.pool import CAPACITY_QUANTUM, BufferPool
from zllm.kvcache.prefix_cache import PrefixCache
from zllm.engine.torch.cache.state import copy_into, slice_state

BPT = LAYOUT.bytes_per_token
SET_BYTES = CAPACITY_QUANTUM * BPT  # one working set of the smallest capacity


def test_in_use_counts_taken_sets_until_each_is_given_back() -> None:
    pool = BufferPool(LAYOUT, "cpu")
    assert pool.in_use_bytes() == 0
    first = pool.take(10)
    second = pool.take(CAPACITY_QUANTUM + 1)  # two rows at once, as a batching engine holds them
    assert pool.in_use_bytes() == SET_BYTES + 2 * SET_BYTES
    pool.give_back(second)
    assert pool.in_use_bytes() == SET_BYTES
    pool.give_back(first)
    assert pool.in_use_bytes() == 0
    assert pool.bytes == pool.idle_bytes() == 2 * SET_BYTES  # the idle set stays allocated: not "in use"


def test_a_set_the_request_outgrew_is_not_left_in_use() -> None:
    pool = BufferPool(LAYOUT, "cpu")
    taken = pool.take(10)
    grown = LAYOUT.empty(2 * CAPACITY_QUANTUM)
    pool.give_back(taken, grown)
    assert pool.in_use_bytes() == 0 and pool.idle_bytes() == 2 * SET_BYTES


def test_staging_is_not_a_working_set() -> None:
    pool = BufferPool(LAYOUT, "cpu")
    pool.staging(4096)
    assert pool.in_use_bytes() == 0 and pool.bytes == 4096


def make_cache() -> PrefixCache:
    return torch_cache(64 << 20)


def finish(cache: PrefixCache, prompt: tuple[int, ...], rid: str) -> None:
    lease = cache.acquire("ns", prompt)
    new = prompt[lease.cached_tokens:]
    copy_into(lease.kv, lease.cached_tokens, synthetic_state(new, lease.cached_tokens))
    cache.finish(lease, prompt, slice_state(lease.kv, 0, len(prompt)), entry_id=rid, prompt_length=len(prompt))


def test_stats_report_working_sets_held_by_running_requests() -> None:
    cache = make_cache()
    lease = cache.acquire("ns", random_tokens(40))
    assert cache.stats().pool_in_use_bytes == SET_BYTES
    cache.release(lease)
    assert cache.stats().pool_in_use_bytes == 0


def test_retained_bytes_are_the_entries_paths_and_a_running_request_pins_none() -> None:
    cache = make_cache()
    system = random_tokens(100)
    finish(cache, system + random_tokens(20, random.Random(1)), "a")
    finish(cache, system + random_tokens(30, random.Random(2)), "b")  # shares a's first 100 tokens: counted once
    stats = cache.stats()
    assert stats.retained_bytes == stats.device_bytes == (100 + 20 + 30) * BPT

    running = cache.acquire("ns", system + random_tokens(5, random.Random(3)))  # copies the shared span
    cache.prune(older_than_s=0)  # drops every entry: the running request holds its own copy
    stats = cache.stats()
    assert (stats.entries, stats.retained_bytes, stats.device_bytes) == (0, 0, 0)
    assert_state_equal(running.kv, running.prompt, running.cached_tokens)
    cache.release(running)
    assert cache.stats().device_bytes == 0
