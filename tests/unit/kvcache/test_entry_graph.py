"""The entry graph (kvcache/entry_graph.py) and its KV on torch (engine/torch/cache/kv.py's span trees), through
the one prefix cache: prefix structure, real-byte accounting, sharing between branches, rounds, eviction, prune."""

import random

from tests.unit.kvcache.conftest import keep, random_tokens, span_bytes, torch_cache

BPT = 512  # bytes per token of the synthetic layout
NS = "ns"


def test_lookup_finds_the_longest_prefix_even_inside_a_node() -> None:
    cache = torch_cache()
    seq = random_tokens(100)
    keep(cache, seq, "a")
    graph = cache.graph
    assert graph.lookup(NS, seq + (1, 2)).length == 100
    assert graph.lookup(NS, seq[:40] + (9999,)).length == 40
    assert graph.lookup(NS, seq[:40] + (9999,)).source.id == "a"
    assert graph.lookup(NS, (seq[0] + 1,)).length == 0
    assert graph.lookup("other", seq).length == 0  # namespaces never see each other
    cache.check_integrity()


def test_branches_share_their_prefix_and_bytes_are_the_real_tensor_bytes() -> None:
    cache = torch_cache()
    prefix = random_tokens(1500)
    one = prefix + random_tokens(80, random.Random(1))
    two = prefix + random_tokens(80, random.Random(2))
    keep(cache, one, "one")
    bytes_one = cache.kv.held_bytes()
    assert bytes_one == span_bytes(cache) == len(one) * BPT
    keep(cache, two, "two")  # splits the first node at 1500
    assert cache.kv.held_bytes() == span_bytes(cache) == (1500 + 80 + 80) * BPT
    cache.check_integrity()
    # dropping one branch frees exactly its own tail; the shared prefix stays for the other
    assert [e.bytes for e in cache.entries() if e.id == "one"] == [80 * BPT]
    cache.graph.drop(cache.graph.entries["one"])
    assert cache.kv.held_bytes() == span_bytes(cache) == len(two) * BPT
    cache.check_integrity()


def test_rounds_bound_a_conversation_and_free_its_dead_tails() -> None:
    cache = torch_cache(rounds=2)
    rng = random.Random(3)
    history, lineage = random_tokens(200, rng), None
    for turn in range(5):
        output = random_tokens(30, rng)
        entry = keep(cache, history + output[:-1], f"t{turn}", prompt_length=len(history), lineage=lineage)
        assert entry.round == turn + 1
        # the next prompt re-renders the output differently after 20 tokens: the old tail becomes dead
        history = history + output[:20] + random_tokens(40, rng)
        found = cache.graph.lookup(NS, history)
        assert found.best is not None and found.best.entry is entry and found.best.continues
        lineage = found.best.entry
        cache.check_integrity()
    assert sorted(e.round for e in cache.graph.entries.values()) == [4, 5]
    assert cache.kv.held_bytes() == span_bytes(cache)


def test_budget_evicts_least_recently_used_first_and_an_entry_about_to_be_shared_last() -> None:
    cache = torch_cache(250 * BPT)
    a, b, c = (random_tokens(100, random.Random(i)) for i in range(3))
    keep(cache, a, "a")
    keep(cache, b, "b")
    cache.graph.entries["a"].users += 1  # an acquire is about to share from a (a is the least recently used)
    keep(cache, c, "c")  # needs room: b is the LRU entry no request uses
    assert set(cache.graph.entries) == {"a", "c"}
    assert cache.kv.held_bytes() <= cache.budget_bytes
    cache.graph.entries["a"].users -= 1
    cache.check_integrity()


def test_an_entry_that_cannot_fit_is_not_kept() -> None:
    cache = torch_cache(50 * BPT)
    assert keep(cache, random_tokens(100), "big") is None
    assert cache.kv.held_bytes() == 0 and not cache.kv.trees and not cache.graph.roots


def test_prune_by_namespace_and_age() -> None:
    cache = torch_cache()
    keep(cache, random_tokens(10, random.Random(1)), "x", namespace="n1")
    keep(cache, random_tokens(10, random.Random(2)), "y", namespace="n2")
    assert cache.prune(namespace="n1").device_freed_bytes == 10 * BPT and set(cache.graph.entries) == {"y"}
    assert cache.prune(older_than_s=3600).device_freed_bytes == 0
    assert cache.prune(older_than_s=0).device_freed_bytes == 10 * BPT and cache.kv.held_bytes() == 0
    cache.check_integrity()


def test_random_operations_keep_every_invariant() -> None:
    rng = random.Random(7)
    cache = torch_cache(3000 * BPT, rounds=3)
    graph = cache.graph
    stems = [random_tokens(rng.randrange(1, 400), rng) for _ in range(4)]
    for step in range(300):
        op = rng.random()
        stem = rng.choice(stems)
        seq = stem[:rng.randrange(1, len(stem) + 1)] + random_tokens(rng.randrange(0, 60), rng)
        if op < 0.6:
            found = graph.lookup(NS, seq)
            lineage = found.best.entry if found.best and found.best.continues else None
            keep(cache, seq, f"e{step}", prompt_length=rng.randrange(len(seq) + 1), lineage=lineage)
            assert cache.kv.held_bytes() <= cache.budget_bytes
        elif graph.entries:
            graph.drop(graph.entries[rng.choice(sorted(graph.entries))])
        cache.check_integrity()
    for entry in list(graph.entries.values()):
        graph.drop(entry)
    assert cache.kv.held_bytes() == 0 and not cache.kv.trees and not graph.roots  # everything comes back


def test_the_entry_shared_from_covers_the_whole_match_whatever_was_used_last() -> None:
    cache = torch_cache()
    prefix = random_tokens(100)
    one = prefix + random_tokens(50, random.Random(1))
    two = prefix + random_tokens(50, random.Random(2))
    keep(cache, one, "one")
    keep(cache, two, "two")  # newer, and shares only the prefix with a continuation of one
    found = cache.graph.lookup(NS, one + (7,))
    assert (found.length, found.source.id) == (150, "one")
    assert cache.graph.lookup(NS, prefix + (7,)).source.id == "two"  # the prefix alone: the newest through it
