"""PrefixCache facade without a model: leases, the one-token rule, hints, tiers, random aborts, near misses.

`serve()` plays the engine: it acquires a lease, "prefills" the uncached suffix and "decodes" by writing
synthetic KV into the working buffers, and finishes with whatever part it got to (an abort part way).
"""

import random

import pytest

from tests.unit.kvcache.conftest import LAYOUT, assert_state_equal, random_tokens, synthetic_state
from zllm.engine.torch.cache.prefix_cache import PrefixCache
from zllm.engine.torch.cache.state import copy_into, slice_state, state_tensors, storage_bytes
from zllm.kvcache import CacheConfig

BPT = 512


def make_cache(tmp_path=None, **config) -> PrefixCache:
    config.setdefault("device_budget_bytes", 64 << 20)
    if tmp_path is not None:
        config.setdefault("ssd_dir", tmp_path / "kv")
        config.setdefault("ssd_min_tokens", 1)
    return PrefixCache(CacheConfig(**config), LAYOUT, "cpu", decode=lambda ids: "|".join(map(str, ids)))


def serve(cache: PrefixCache, prompt, output=(), *, namespace="ns", rid="r", hint=None, held=None):
    """Run one request's cache lifecycle; `held` (tokens whose KV exists at the end) models an abort."""
    prompt, output = tuple(prompt), tuple(output)
    lease = cache.acquire(namespace, prompt, hint=hint, max_new_tokens=max(len(output), 1))
    assert_state_equal(lease.working, prompt, lease.cached_tokens)  # the restored prefix is exact
    sequence = (prompt + output)[:-1] if output else prompt  # the last sampled token is never fed forward
    if held is not None:
        sequence = sequence[:held]
    new = sequence[lease.cached_tokens:]
    if new:
        copy_into(lease.working, lease.cached_tokens, synthetic_state(new, lease.cached_tokens))
    cache.finish(lease, sequence, slice_state(lease.working, 0, len(sequence)), entry_id=rid,
                 prompt_length=len(prompt))
    return lease


def test_a_repeated_prompt_restores_all_but_its_last_token() -> None:
    cache = make_cache()
    prompt = random_tokens(50)
    assert serve(cache, prompt, rid="a").cached_tokens == 0
    again = serve(cache, prompt, rid="b")
    assert (again.cached_tokens, again.tier) == (49, "device")
    cache.check_integrity()


def test_next_turn_restores_prompt_plus_output_fed_forward() -> None:
    cache = make_cache()
    prompt, output = random_tokens(100), random_tokens(10, random.Random(1))
    serve(cache, prompt, output, rid="t1")
    turn2 = prompt + output + random_tokens(20, random.Random(2))
    lease = serve(cache, turn2, rid="t2")
    assert lease.cached_tokens == 109  # prompt + all outputs but the last (its KV was never computed)
    assert lease.lineage is not None and lease.lineage.id == "t1" and lease.round == 2


def test_namespaces_are_isolated() -> None:
    cache = make_cache()
    prompt = random_tokens(60)
    serve(cache, prompt, namespace="alice", rid="a")
    assert serve(cache, prompt, namespace="bob", rid="b").cached_tokens == 0


def test_hints_are_verified_against_the_tokens() -> None:
    cache = make_cache()
    first = random_tokens(40)
    serve(cache, first, rid="first")
    assert serve(cache, first + (1, 2), rid="x", hint="first").tier == "device-hint"
    other = random_tokens(40, random.Random(9))
    lease = serve(cache, other, rid="y", hint="first")  # a wrong hint is just ignored
    assert (lease.cached_tokens, lease.tier) == (0, "cold")


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
    tier = cache.device_tier
    retained = {id(n): n for e in tier.entries.values() for n in e.node.path()}
    assert tier.bytes == sum(n.nbytes for n in retained.values())
    assert tier.bytes == storage_bytes(t for n in retained.values() for t in state_tensors(n.kv))
    assert all(n.locks == 0 for tree in tier.trees.values() for n in tree.nodes())
    assert cache.pool.bytes == cache.pool.idle_bytes()  # one working set, idle; nothing leaked


def test_ssd_tier_survives_a_restart_and_chains_turns(tmp_path) -> None:
    cache = make_cache(tmp_path)
    prompt, output = random_tokens(300), random_tokens(20, random.Random(1))
    serve(cache, prompt, output, rid="t1")
    turn2 = prompt + output + random_tokens(30, random.Random(2))
    serve(cache, turn2, random_tokens(5, random.Random(3)), rid="t2")
    cache.flush()
    rows = {r.id: r for r in cache.store.snapshots()}
    assert rows["t2"].parent == "t1" and rows["t2"].parent_len == 319  # turn 2 stored only its new tokens
    cache.check_integrity()
    cache.close()

    restarted = make_cache(tmp_path)
    turn3 = turn2 + random_tokens(5, random.Random(3))[:4] + random_tokens(10, random.Random(4))
    lease = serve(restarted, turn3, rid="t3")
    assert lease.tier == "ssd" and lease.cached_tokens == len(turn2) + 4
    restarted.check_integrity()
    restarted.close()


def test_ssd_restores_only_what_the_device_tier_lacks(tmp_path) -> None:
    cache = make_cache(tmp_path)
    conversation = random_tokens(400)
    serve(cache, conversation, rid="long")
    cache.flush()
    cache.prune(tiers=("device",), older_than_s=0)  # device tier flushed, SSD keeps it
    serve(cache, conversation[:100], rid="short")  # the device tier now has only the first 99
    lease = serve(cache, conversation + (7,), rid="next")
    assert lease.tier == "ssd" and lease.cached_tokens == 400  # [0, 99) from device, [99, 400) from SSD
    cache.close()


def test_restores_that_would_be_slower_than_recompute_are_skipped(tmp_path) -> None:
    cache = make_cache(tmp_path)
    prompt = random_tokens(200)
    serve(cache, prompt, rid="a")
    cache.flush()
    cache.prune(tiers=("device",), older_than_s=0)
    cache.cost.observe_prefill(1000, 1e-6)  # a machine where prefill is nearly free...
    cache.cost.observe_restore(1000, 1.0)  # ...and reading is slow
    lease = serve(cache, prompt + (1,), rid="b")
    assert lease.tier == "cold" and cache.stats().ssd_not_worth_it == 1
    cache.close()


def test_near_misses_record_where_and_what_diverged() -> None:
    cache = make_cache()
    cached = random_tokens(1200)
    serve(cache, cached, rid="orig")
    changed = cached[:1150] + (4095,) + cached[1151:]
    lease = serve(cache, changed, rid="edit")
    assert lease.cached_tokens == 1150
    (miss,) = cache.near_misses()
    assert (miss.entry_id, miss.divergence, miss.in_prompt, miss.tier) == ("orig", 1150, True, "device")
    assert miss.request_after.startswith("4095|") and miss.entry_after.startswith(f"{cached[1150]}|")
    assert miss.before.endswith(str(cached[1149]))
    serve(cache, random_tokens(300, random.Random(5)), rid="unrelated")  # shares nothing: no record
    serve(cache, cached[:1190], rid="rewind")  # a prefix of what is cached diverges from nothing: a full hit
    assert len(cache.near_misses()) == 1


def test_a_near_miss_names_its_segment_with_the_injected_describer_only_when_recorded() -> None:
    cache = make_cache()
    cached = random_tokens(1200)
    serve(cache, cached, rid="orig")
    asked: list[int] = []

    def describe(index: int) -> str:
        asked.append(index)
        return f"message {index // 100} (user)"

    def acquire(prompt, describer):
        lease = cache.acquire("ns", prompt, describe_position=describer)
        cache.release(lease)
        return lease

    assert acquire(cached[:600] + random_tokens(20), describe).near_miss is None  # shares too little
    assert acquire(cached, describe).near_miss is None  # a full hit
    assert asked == []  # never called unless a near miss is recorded
    miss = acquire(cached[:1130] + (4095,) + cached[1131:], describe).near_miss
    assert (miss.divergence, miss.segment, asked) == (1130, "message 11 (user)", [1130])
    assert cache.near_misses()[-1].segment == "message 11 (user)"

    def broken(index: int) -> str:
        raise RuntimeError("template exploded")

    assert acquire(cached[:1140] + (4095,), broken).near_miss.segment is None  # a diagnostic never fails
    assert acquire(cached[:1150] + (4095,), None).near_miss.segment is None


@pytest.mark.parametrize("budget_tokens, cached", [(0, 0), (2500, 0), (5000, 1499)])
def test_a_request_is_never_refused_for_lack_of_budget(budget_tokens, cached) -> None:
    """The working set (2048 tokens for this prompt) is admitted whatever the budget; what does not fit
    beside it is simply not kept."""
    cache = make_cache(device_budget_bytes=budget_tokens * BPT)
    prompt = random_tokens(1500)
    serve(cache, prompt, rid="a")
    assert serve(cache, prompt, rid="b").cached_tokens == cached
    assert cache.device_tier.bytes + cache.pool.bytes <= max(budget_tokens * BPT, cache.pool.bytes)
    cache.check_integrity()
