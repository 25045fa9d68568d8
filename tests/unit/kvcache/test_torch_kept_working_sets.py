"""A torch hit that continues a kept working set runs in it, without copying the prefix (engine/torch/cache/kv.py,
backing.py); every other hit copies, and all of them equal a full prefill.

On the tiny qwen3 and its real engine (tests/support/cache_contract.py): the next turn's running state *is* the
kept storage, and the new entry is kept in it; a fork copies (early) or clones out the tail it would overwrite
(late), and the entry it forked from still restores exactly; two requests continuing one entry get two sets.
Without a model (synthetic KV, tests/unit/kvcache/conftest.py): an SSD export in flight is never written over, and a
random mix of turns, forks, retries, aborts, concurrent leases and prunes keeps every restored prefix exact and the
bytes accounted.
"""

from __future__ import annotations

import gc
import random

import pytest

from tests.support.cache_contract import as_numpy, contract_backend
from tests.unit.kvcache.conftest import LAYOUT, assert_state_equal, random_tokens, synthetic_state
from tests.unit.kvcache.test_kv_prefix_cache import BPT, make_cache
from zllm.engine.contract import Row
from zllm.engine.torch.cache.backing import capacity
from zllm.engine.torch.cache.state import buffers_key, copy_into, slice_state


def tokens(n: int, seed: int = 0) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(30, 4000) for _ in range(n))


TURN1 = tokens(700)  # 700 + 4 tokens of room: a 1024-token working set, over half full, so it is kept whole


@pytest.fixture(scope="module")
def backend():
    yield from contract_backend("torch")


@pytest.fixture
def cache(backend):
    cache = backend.cache()
    yield cache
    cache.check_integrity()
    cache.close()


def storage_of(cache, entry_id: str) -> int:
    return buffers_key(cache.graph.entries[entry_id].kv.node.kv)


def test_the_next_turn_runs_in_the_kept_working_set(backend, cache) -> None:
    _, generated = backend.run(cache, TURN1, "t1", generate=4)
    kept = storage_of(cache, "t1")
    turn2 = TURN1 + tuple(generated) + tokens(20, seed=2)
    lease, generated2 = backend.run(cache, turn2, "t2", generate=3)
    assert (lease.tier, lease.cached_tokens) == ("device", len(TURN1) + 3)
    assert buffers_key(lease.kv) == kept == storage_of(cache, "t2"), "the hit ran in the kept set, and stays there"
    assert cache.kv.adoptions == 1
    assert (cache.kv.held_bytes(), cache.kv.pool_bytes()) == (1024 * BPT, 0), "one working set, nothing copied"
    turn3 = turn2 + tuple(generated2) + tokens(9, seed=3)
    lease3, logits = backend.ask(cache, turn3)
    assert lease3.cached_tokens == len(turn2) + 2 and buffers_key(lease3.kv) == kept
    backend.assert_restored_exactly(lease3, logits)


def test_forks_copy_or_clone_out_and_every_entry_stays_exact(backend, cache) -> None:
    backend.run(cache, TURN1, "t1")
    kept = storage_of(cache, "t1")
    early, logits = backend.ask(cache, TURN1[:300] + tokens(30, seed=4))  # 400 kept tokens past it: copy 300
    assert early.cached_tokens == 300 and buffers_key(early.kv) != kept
    backend.assert_restored_exactly(early, logits)
    late, logits = backend.ask(cache, TURN1[:650] + tokens(30, seed=5))  # clone out 50, write past 650 in place
    assert late.cached_tokens == 650 and buffers_key(late.kv) == kept
    backend.assert_restored_exactly(late, logits)
    again, logits = backend.ask(cache, TURN1 + (7,))  # its tail was written over by the late fork's tokens
    assert again.cached_tokens == len(TURN1)
    backend.assert_restored_exactly(again, logits)


def test_two_requests_continuing_one_entry_each_get_their_own_set(backend, cache) -> None:
    backend.run(cache, TURN1, "t1")
    prompts = [TURN1 + tokens(12, seed=6), TURN1 + tokens(15, seed=7)]
    leases = [backend.acquire(cache, prompt) for prompt in prompts]  # both admitted before either runs
    assert [lease.cached_tokens for lease in leases] == [len(TURN1), len(TURN1)]
    assert buffers_key(leases[0].kv) == storage_of(cache, "t1") != buffers_key(leases[1].kv)
    seqs = [backend.engine.open(lease) for lease in leases]
    rows = [Row(seq, prompt[len(TURN1):]) for seq, prompt in zip(seqs, prompts)]
    for lease, logits in zip(leases, backend.engine.step(rows)):  # one packed forward: both append at once
        backend.assert_restored_exactly(lease, as_numpy(logits))
    for lease, seq in zip(leases, seqs):
        cache.release(lease, backend.engine.kept_state(seq).buffers)
    assert cache.kv.reserved_bytes() == 0


# ---------------------------------------------------------------- without a model


def serve(cache, prompt, output=(), *, rid="r", held=None):
    """One request's cache lifecycle as the engine runs it, with synthetic KV: the restored prefix must be exact;
    the rest is written in place, into a set twice as large when it outgrows its own (kv_layers.py's growth);
    `held` (tokens whose KV exists at the end) models an abort."""
    prompt, output = tuple(prompt), tuple(output)
    lease = cache.acquire("ns", prompt, max_new_tokens=max(len(output), 1))
    assert_state_equal(lease.kv, prompt, lease.cached_tokens)
    sequence = ((prompt + output)[:-1] if output else prompt)[:held]
    working = lease.kv
    if len(sequence) > capacity(working):
        working = LAYOUT.empty(max(len(sequence), 2 * capacity(working)))
        copy_into(working, 0, slice_state(lease.kv, 0, lease.cached_tokens))
    copy_into(working, lease.cached_tokens, synthetic_state(sequence[lease.cached_tokens:], lease.cached_tokens))
    cache.finish(lease, sequence, slice_state(working, 0, len(sequence)), entry_id=rid, prompt_length=len(prompt),
                 buffers=working)
    return lease


def test_an_export_in_flight_is_never_written_over() -> None:
    cache = make_cache()
    base = random_tokens(700)
    serve(cache, base, rid="base")
    kept = storage_of(cache, "base")
    export = cache.kv.export(cache.graph.entries["base"].kv, None, len(base))  # the SSD writer has not run it yet
    fork = base[:650] + random_tokens(20, random.Random(1))
    assert buffers_key(serve(cache, fork, rid="f1").kv) != kept, "adopted under a reader"
    assert bytes(export()) == bytes(cache.kv.export(None, synthetic_state(base), len(base))())
    del export
    gc.collect()
    later = base[:660] + random_tokens(20, random.Random(2))  # f1 kept its own set: fork base again
    assert buffers_key(serve(cache, later, rid="f2").kv) == kept, "read: free to adopt"
    cache.check_integrity()


def test_a_conversation_that_outgrows_its_set_moves_to_the_grown_one() -> None:
    cache = make_cache()
    base = random_tokens(700)
    serve(cache, base, rid="t1")
    first = storage_of(cache, "t1")
    turn2 = base + random_tokens(400, random.Random(1))  # 1,100 tokens: past the 1,024-token set, it doubles
    assert buffers_key(serve(cache, turn2, rid="t2").kv) == first
    path = cache.graph.entries["t2"].kv.node.path()
    assert {buffers_key(node.kv) for node in path} == {storage_of(cache, "t2")} != {first}
    assert cache.kv.held_bytes() == 2048 * BPT, "the first set was let go: one set holds the conversation"
    assert buffers_key(serve(cache, turn2 + (5,), rid="t3").kv) == storage_of(cache, "t2")
    cache.check_integrity()


def test_random_turns_forks_and_prunes_keep_every_restore_exact() -> None:
    """`serve` asserts that each restored prefix is exactly the synthetic KV of its tokens and positions."""
    rng = random.Random(5)
    cache = make_cache(device_budget_bytes=12_000 * BPT, rounds=3)
    conversations = [random_tokens(rng.randrange(400, 900), rng) for _ in range(3)]
    for i in range(80):
        c = rng.randrange(len(conversations))
        prompt, output = conversations[c], random_tokens(rng.randrange(1, 40), rng)
        roll = rng.random()
        if roll < 0.15:  # a fork inside the conversation (a rewritten turn, a subagent)
            prompt = prompt[:rng.randrange(1, len(prompt))] + random_tokens(rng.randrange(1, 30), rng)
        elif roll < 0.25:  # a second request continuing it while this one runs
            other = cache.acquire("ns", prompt + random_tokens(5, rng))
            assert_state_equal(other.kv, other.prompt, other.cached_tokens)
            if len(other.prompt) > capacity(other.kv):  # it would grow into a set of its own
                cache.release(other)
                continue
            copy_into(other.kv, other.cached_tokens, synthetic_state(other.prompt[other.cached_tokens:],
                                                                     other.cached_tokens))
            serve(cache, prompt, output, rid=f"r{i}")
            assert_state_equal(other.kv, other.prompt)  # neither wrote over the other
            cache.release(other)
            continue
        elif roll < 0.3:
            cache.prune(max_bytes=rng.randrange(0, 8000) * BPT)
        held = rng.randrange(0, len(prompt) + len(output)) if rng.random() < 0.2 else None
        serve(cache, prompt, output, rid=f"r{i}", held=held)
        if held is None and roll >= 0.15:
            conversations[c] = prompt + output[:-1] + random_tokens(rng.randrange(1, 200), rng)
        cache.check_integrity()
    assert cache.kv.adoptions > 10, "the common path was taken"
    assert cache.kv.reserved_bytes() == 0 and not any(b.running for b in cache.kv.backings.values())
