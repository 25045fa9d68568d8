"""The prefix cache over torch's KV (engine/torch/cache/kv.py) without a model, where it differs from llama.cpp's: the span tree's
bytes after random aborts, turns chained on the SSD tier, admission whatever the budget. What both caches must
do (hits, hints, namespaces, eviction, restores, near misses, damage) is tests/unit/kvcache/test_cache_contract.py.

`serve()` plays the engine: it acquires a lease, "prefills" the uncached suffix and "decodes" by writing
synthetic KV into the working buffers, and finishes with whatever part it got to (an abort part way).
"""

import random

import pytest

from tests.unit.kvcache.conftest import assert_state_equal, random_tokens, synthetic_state, torch_cache
from zllm.engine.torch.cache.state import copy_into, slice_state, state_tensors, storage_bytes
from zllm.kvcache.prefix_cache import PrefixCache

BPT = 512


def make_cache(tmp_path=None, **config) -> PrefixCache:
    config.setdefault("device_budget_bytes", 64 << 20)
    if tmp_path is not None:
        config.setdefault("ssd_dir", tmp_path / "kv")
        config.setdefault("ssd_min_tokens", 1)
    return torch_cache(decode=lambda ids: "|".join(map(str, ids)), **config)


def serve(cache: PrefixCache, prompt, output=(), *, namespace="ns", rid="r", hint=None, held=None):
    """Run one request's cache lifecycle; `held` (tokens whose KV exists at the end) models an abort."""
    prompt, output = tuple(prompt), tuple(output)
    lease = cache.acquire(namespace, prompt, hint=hint, max_new_tokens=max(len(output), 1))
    assert_state_equal(lease.kv, prompt, lease.cached_tokens)  # the restored prefix is exact
    sequence = (prompt + output)[:-1] if output else prompt  # the last sampled token is never fed forward
    if held is not None:
        sequence = sequence[:held]
    new = sequence[lease.cached_tokens:]
    if new:
        copy_into(lease.kv, lease.cached_tokens, synthetic_state(new, lease.cached_tokens))
    cache.finish(lease, sequence, slice_state(lease.kv, 0, len(sequence)), entry_id=rid,
                 prompt_length=len(prompt))
    return lease


def test_random_aborts_leave_exactly_the_retained_entries_bytes() -> None:
    rng = random.Random(11)
    cache = make_cache(device_budget_bytes=40_000 * BPT, rounds=3)
    system = random_tokens(300, rng)
    conversations = [system + random_tokens(rng.randrange(5, 50), rng) for _ in range(4)]
    for i in range(50):
        c = rng.randrange(len(conversations))
        prompt, output = conversations[c], random_tokens(rng.randrange(1, 30), rng)
        aborted = rng.random() < 0.3
        held = rng.randrange(0, len(prompt) + len(output)) if aborted else None
        serve(cache, prompt, output, rid=f"r{i}", held=held)
        if not aborted:
            conversations[c] = prompt + output + random_tokens(rng.randrange(1, 20), rng)
        cache.check_integrity()
    held = cache.kv.held_bytes()
    retained = {id(n): n for e in cache.graph.entries.values() for n in e.kv.node.path()}
    # each storage once, whole: an owned span's clone, or a kept working set its views pin
    assert held == storage_bytes(t for n in retained.values() for t in state_tensors(n.kv))
    assert cache.kv.reserved_bytes() == 0 and not any(b.running for b in cache.kv.backings.values())
    assert cache.kv.pool.bytes == cache.kv.pool.idle_bytes()  # at most one working set, idle; nothing leaked


def test_ssd_tier_survives_a_restart_and_keeps_each_turn_whole(tmp_path) -> None:
    cache = make_cache(tmp_path)
    prompt, output = random_tokens(300), random_tokens(20, random.Random(1))
    serve(cache, prompt, output, rid="t1")
    turn2 = prompt + output + random_tokens(30, random.Random(2))
    serve(cache, turn2, random_tokens(5, random.Random(3)), rid="t2")
    cache.flush()
    rows = {r.id: r for r in cache.store.snapshots()}
    assert rows["t2"].parent is None and rows["t2"].length == len(turn2) + 4  # whole: one file per restore
    cache.check_integrity()
    cache.close()

    restarted = make_cache(tmp_path)
    turn3 = turn2 + random_tokens(5, random.Random(3))[:4] + random_tokens(10, random.Random(4))
    lease = serve(restarted, turn3, rid="t3")
    assert lease.tier == "ssd" and lease.cached_tokens == len(turn2) + 4
    restarted.check_integrity()
    restarted.close()


@pytest.mark.parametrize("budget_tokens, cached", [(0, 0), (2500, 0), (5000, 1499)])
def test_a_request_is_never_refused_for_lack_of_budget(budget_tokens, cached) -> None:
    """The working set (2048 tokens for this prompt) is admitted whatever the budget; what does not fit
    beside it is simply not kept."""
    cache = make_cache(device_budget_bytes=budget_tokens * BPT)
    prompt = random_tokens(1500)
    serve(cache, prompt, rid="a")
    assert serve(cache, prompt, rid="b").cached_tokens == cached
    assert cache.kv.held_bytes() + cache.kv.pool.bytes <= max(budget_tokens * BPT, cache.kv.pool.bytes)
    cache.check_integrity()
