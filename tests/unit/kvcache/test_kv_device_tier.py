"""Device tier: radix structure, real-byte accounting, sharing between branches, rounds, eviction, prune."""

import random

from tests.unit.kvcache.conftest import random_tokens, synthetic_state
from zllm.engine.torch.cache.device_tier import DeviceTier
from zllm.engine.torch.cache.state import state_tensors, storage_bytes

BPT = 512  # bytes per token of the synthetic layout
NS = "ns"


def insert(tier: DeviceTier, tokens, entry_id: str, *, prompt_length=None, lineage=None, namespace=NS):
    tier.make_room(tier.new_bytes(namespace, tuple(tokens), synthetic_state(tokens)))
    return tier.insert(namespace, tuple(tokens), synthetic_state(tokens), entry_id=entry_id,
                       prompt_length=len(tokens) if prompt_length is None else prompt_length, lineage=lineage)


def held_bytes(tier: DeviceTier) -> int:
    return storage_bytes(t for tree in tier.trees.values() for n in tree.nodes() for t in state_tensors(n.kv))


def test_lookup_finds_the_longest_prefix_even_inside_a_node() -> None:
    tier = DeviceTier(1 << 30, rounds=4)
    seq = random_tokens(100)
    insert(tier, seq, "a")
    assert tier.lookup(NS, seq + (1, 2)).length == 100
    assert tier.lookup(NS, seq[:40] + (9999,)).length == 40
    assert tier.lookup(NS, (seq[0] + 1,)).length == 0
    assert tier.lookup("other", seq).length == 0  # namespaces never see each other
    tier.check_integrity()


def test_branches_share_their_prefix_and_bytes_are_the_real_tensor_bytes() -> None:
    tier = DeviceTier(1 << 30, rounds=4)
    prefix = random_tokens(1500)
    one = prefix + random_tokens(80, random.Random(1))
    two = prefix + random_tokens(80, random.Random(2))
    insert(tier, one, "one")
    bytes_one = tier.bytes
    assert bytes_one == held_bytes(tier) == len(one) * BPT
    insert(tier, two, "two")  # splits the first node at 1500
    assert tier.bytes == held_bytes(tier) == (1500 + 80 + 80) * BPT
    assert tier.bytes < 1.2 * bytes_one
    tier.check_integrity()
    # dropping one branch frees exactly its own tail; the shared prefix stays for the other
    assert tier.drop("one") == 80 * BPT
    assert tier.bytes == held_bytes(tier) == len(two) * BPT
    tier.check_integrity()


def test_rounds_bound_a_conversation_and_free_its_dead_tails() -> None:
    tier = DeviceTier(1 << 30, rounds=2)
    rng = random.Random(3)
    history, lineage = random_tokens(200, rng), None
    for turn in range(5):
        output = random_tokens(30, rng)
        entry = insert(tier, history + output[:-1], f"t{turn}", prompt_length=len(history), lineage=lineage)
        assert entry.round == turn + 1
        # the next prompt re-renders the output differently after 20 tokens: the old tail becomes dead
        history = history + output[:20] + random_tokens(40, rng)
        found = tier.lookup(NS, history)
        assert found.best is not None and found.best.entry is entry and found.best.continues
        lineage = found.best.entry
        tier.check_integrity()
    assert sorted(e.round for e in tier.entries.values()) == [4, 5]
    assert tier.bytes == held_bytes(tier)


def test_budget_evicts_least_recently_used_first_and_never_locked_paths() -> None:
    tier = DeviceTier(250 * BPT, rounds=4)
    a, b, c = (random_tokens(100, random.Random(i)) for i in range(3))
    insert(tier, a, "a")
    insert(tier, b, "b")
    locked = tier.lock(tier.lookup(NS, a + (1,)).match)  # a running request restored from a
    insert(tier, c, "c")  # needs room: b is the LRU unlocked entry
    assert set(tier.entries) == {"a", "c"}
    assert tier.bytes <= tier.budget_bytes
    tier.unlock(NS, locked)
    tier.check_integrity()


def test_an_entry_that_cannot_fit_is_not_kept() -> None:
    tier = DeviceTier(50 * BPT, rounds=4)
    assert insert(tier, random_tokens(100), "big") is None
    assert tier.bytes == 0 and not tier.trees


def test_prune_by_namespace_and_age() -> None:
    tier = DeviceTier(1 << 30, rounds=4)
    insert(tier, random_tokens(10, random.Random(1)), "x", namespace="n1")
    insert(tier, random_tokens(10, random.Random(2)), "y", namespace="n2")
    assert tier.prune(namespace="n1") == 10 * BPT and set(tier.entries) == {"y"}
    assert tier.prune(older_than_s=3600) == 0
    assert tier.prune(older_than_s=0) == 10 * BPT and tier.bytes == 0
    tier.check_integrity()


def test_random_operations_keep_every_invariant() -> None:
    rng = random.Random(7)
    tier = DeviceTier(3000 * BPT, rounds=3)
    stems = [random_tokens(rng.randrange(1, 400), rng) for _ in range(4)]
    locks = []
    for step in range(300):
        op = rng.random()
        stem = rng.choice(stems)
        seq = stem[:rng.randrange(1, len(stem) + 1)] + random_tokens(rng.randrange(0, 60), rng)
        if op < 0.5 and seq:
            found = tier.lookup(NS, seq)
            lineage = found.best.entry if found.best and found.best.continues else None
            insert(tier, seq, f"e{step}", prompt_length=rng.randrange(len(seq) + 1), lineage=lineage)
        elif op < 0.65:
            locks.append(tier.lock(tier.lookup(NS, seq).match))
        elif op < 0.8 and locks:
            tier.unlock(NS, locks.pop(rng.randrange(len(locks))))
        elif tier.entries:
            tier.drop(rng.choice(sorted(tier.entries)))
        tier.check_integrity()
    for locked in locks:
        tier.unlock(NS, locked)
    for entry_id in list(tier.entries):
        tier.drop(entry_id)
    assert tier.bytes == 0 and not tier.trees  # everything comes back
