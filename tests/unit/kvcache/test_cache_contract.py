"""One cache contract, both backends: the one PrefixCache (kvcache/prefix_cache.py) over the torch backend's KV
(engine/torch/cache/kv.py) and llama.cpp's (engine/llamacpp/kv.py), each over the tiny qwen3 (random weights, the real Qwen tokenizer) and its real engine, through one fixture.

What every prefix cache must do, observed only through the seams the runtime uses (kvcache/contract.py,
engine/contract.py): a repeated prompt and the next turn hit the device tier; namespaces and hints hold; a
budget evicts least recently used entries; snapshots restore after a restart; a restore equals a full prefill
(logits within the backend's stated tolerance, tests/support/cache_contract.py); near misses are recorded at
their edges on both tiers; and every kind of damage to the SSD tier is set aside and served cold. First, that
both caches and both leases have the seam's shape at all.
"""

from __future__ import annotations

import inspect
import logging
import random
from dataclasses import fields

import pytest

from tests.support.backends import BACKENDS
from tests.support.cache_contract import contract_backend
from tests.support.snapshot_damage import BLOB_DAMAGE, INDEX_DAMAGE, blobs
from zllm.control.served import ServedCache
from zllm.kvcache import CacheConfig
from zllm.kvcache.contract import CacheLease, KVPrefixCache
from zllm.kvcache.prefix_cache import Lease, PrefixCache
from zllm.kvcache.tiers import BaseLease
from zllm.runtime.detokenizer import raw_decoder


def tokens(n: int, seed: int = 0) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(30, 4000) for _ in range(n))


# ---------------------------------------------------------------- the seam's shape (no model)


def protocol_members(protocol: type) -> dict[str, object]:
    """The methods and properties a Protocol declares (not what typing.Protocol itself adds)."""
    return {name: value for name, value in vars(protocol).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def shape_mismatches(protocol: type, cls: type) -> list[str]:
    """Where `cls` differs from `protocol`: a missing member, or a method whose parameters (names, kinds,
    which have defaults) are not the protocol's. Annotations are left to a type checker."""
    bad = []
    for name, declared in protocol_members(protocol).items():
        actual = inspect.getattr_static(cls, name, None)
        if actual is None:
            bad.append(f"{cls.__name__} lacks {name}")
        elif isinstance(declared, property):
            if not isinstance(actual, property):
                bad.append(f"{cls.__name__}.{name} is not a property")
        elif signature_shape(declared) != signature_shape(getattr(cls, name)):
            bad.append(f"{cls.__name__}.{name}{inspect.signature(getattr(cls, name))} is not "
                       f"{name}{inspect.signature(declared)}")
    return bad


def signature_shape(function) -> list[tuple[str, object, bool]]:
    parameters = list(inspect.signature(function).parameters.values())
    return [(p.name, p.kind, p.default is not p.empty) for p in parameters if p.name != "self"]


def test_the_cache_and_its_lease_have_the_seams_shape() -> None:
    cache, lease = PrefixCache, Lease
    assert shape_mismatches(KVPrefixCache, cache) == []
    assert shape_mismatches(ServedCache, cache) == []  # the control methods' view of it
    assert set(CacheLease.__annotations__) <= {f.name for f in fields(lease)}, "a lease field the runtime reads"
    assert issubclass(lease, BaseLease) and set(CacheLease.__annotations__) == {f.name for f in fields(BaseLease)}
    assert "config" in inspect.signature(cache).parameters


def test_the_shape_check_catches_a_renamed_parameter_and_a_missing_method() -> None:
    class Renamed(PrefixCache):
        def finish(self, lease, tokens, state, *, entry_id, prompt_length, hint_key=None, buffers=None): ...

        admission_room = None

    assert set(shape_mismatches(KVPrefixCache, Renamed)) == {
        f"Renamed.finish{inspect.signature(Renamed.finish)} is not finish{inspect.signature(KVPrefixCache.finish)}",
        "Renamed lacks admission_room"}


def test_the_near_miss_defaults_are_the_ones_pinned_here() -> None:
    config = CacheConfig(device_budget_bytes=1)
    assert (config.near_miss_min_tokens, config.near_miss_fraction) == (1024, 0.9)


# ---------------------------------------------------------------- behaviour, on both backends


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    yield from contract_backend(request.param)


@pytest.fixture
def cache(backend):
    cache = backend.cache()
    yield cache
    cache.check_integrity()
    cache.close()


def test_a_repeated_prompt_restores_all_but_its_last_token(backend, cache) -> None:
    prompt = tokens(120)
    first, _ = backend.run(cache, prompt, "a")
    assert (first.tier, first.cached_tokens) == ("cold", 0)
    lease, logits = backend.ask(cache, prompt)
    assert (lease.tier, lease.cached_tokens) == ("device", len(prompt) - 1)
    backend.assert_restored_exactly(lease, logits)
    assert cache.stats().device_hits == 1


def test_the_next_turn_restores_the_prompt_and_the_output_fed_forward(backend, cache) -> None:
    prompt = tokens(100)
    _, generated = backend.run(cache, prompt, "t1", generate=4)
    turn2 = prompt + tuple(generated) + tokens(20, seed=2)
    lease, logits = backend.ask(cache, turn2)
    # the last sampled token was never fed forward: its KV does not exist
    assert (lease.tier, lease.cached_tokens, lease.round) == ("device", len(prompt) + 3, 2)
    backend.assert_restored_exactly(lease, logits, pieces=(len(prompt), 1, 1, 1))  # prefill, then 3 decode steps


def test_namespaces_are_isolated(backend, cache) -> None:
    prompt = tokens(60)
    backend.run(cache, prompt, "a", namespace="alice")
    lease, _ = backend.ask(cache, prompt, namespace="bob")
    assert (lease.tier, lease.cached_tokens) == ("cold", 0)


def test_hints_are_verified_against_the_tokens(backend, cache) -> None:
    first = tokens(40)
    backend.run(cache, first, "first")
    assert backend.ask(cache, first + (31, 32), hint="first")[0].tier == "device-hint"
    lease, _ = backend.ask(cache, tokens(40, seed=9), hint="first")  # a hint naming other tokens is ignored
    assert (lease.tier, lease.cached_tokens) == ("cold", 0)


def test_rounds_zero_keeps_nothing(backend) -> None:
    cache = backend.cache(rounds=0)
    backend.run(cache, tokens(50), "a", generate=2)
    assert cache.entries() == [] and cache.stats().not_kept == 1 and not cache.keeps_state
    cache.close()


def test_the_budget_evicts_least_recently_used_entries(backend) -> None:
    # room for two or three kept entries beside a running request (torch's working set takes 1024 of it, its
    # pool's smallest bucket), so which one goes is the policy's choice, not the only one there is
    cache = backend.cache(budget_tokens=1900)
    prompts = [tokens(400, seed=k) for k in range(5)]
    for n, prompt in enumerate(prompts):
        assert cache.admission_need(len(prompt), 4) <= cache.admission_room()
        backend.run(cache, prompt, f"r{n}", generate=2)
        stats = cache.stats()
        assert stats.device_bytes <= stats.device_budget_bytes
    kept = [e.id for e in cache.entries() if e.tier == "device"]
    assert 2 <= len(kept) < len(prompts) and kept == [f"r{4 - n}" for n in range(len(kept))], kept  # the newest
    assert cache.admission_need(2000, 4) > cache.admission_room()  # more than the whole budget
    cache.check_integrity()
    cache.close()


BASE = tokens(600, seed=5)
NEW = tokens(7, seed=6)
# (tokens of BASE the prompt starts with, tokens appended): a prefix inside BASE, BASE itself, BASE plus more
BOUNDARIES = [(1, NEW), (100, NEW), (599, NEW), (600, NEW), (600, ()), (350, ())]


def assert_restores_equal_full_prefill(backend, cache, tier: str) -> None:
    for keep, appended in BOUNDARIES:
        prompt = BASE[:keep] + appended
        lease, logits = backend.ask(cache, prompt)
        assert lease.cached_tokens == min(keep, len(prompt) - 1), (keep, len(appended))
        assert lease.tier == (tier if lease.cached_tokens else "cold")
        backend.assert_restored_exactly(lease, logits)


def test_device_hits_equal_a_full_prefill_at_every_boundary(backend, cache) -> None:
    backend.run(cache, BASE, "base")
    assert_restores_equal_full_prefill(backend, cache, "device")


def test_ssd_hits_equal_a_full_prefill_at_every_boundary_after_a_restart(backend, tmp_path) -> None:
    first = backend.cache(tmp_path / "kv")
    backend.run(first, BASE, "base")
    first.close()  # drains the writer
    restarted = backend.cache(tmp_path / "kv")
    assert restarted.stats().ssd.snapshots == 1
    assert_restores_equal_full_prefill(backend, restarted, "ssd")
    restarted.check_integrity()
    restarted.close()


def _on_ssd_only(backend, tmp_path, prompt, request_id: str):
    """A cache that ran `prompt` and then forgot it on the device tier: the SSD tier alone holds it."""
    cache = backend.cache(tmp_path / "kv")
    backend.run(cache, prompt, request_id)
    cache.flush()
    cache.prune(tiers=("device",), older_than_s=0)
    return cache


def test_ssd_restores_what_the_device_tier_lacks(backend, tmp_path) -> None:
    conversation = tokens(400)
    cache = _on_ssd_only(backend, tmp_path, conversation, "long")
    backend.run(cache, conversation[:100], "short")  # the device tier now holds only its first 100
    lease, logits = backend.ask(cache, conversation + (7,))
    assert (lease.tier, lease.cached_tokens) == ("ssd", 400)
    backend.assert_restored_exactly(lease, logits)
    cache.close()


def test_a_conversation_keeps_one_snapshot_and_an_edit_forks_from_it(backend, tmp_path) -> None:
    """Each turn's snapshot holds the whole conversation: the earlier turns' are deleted as it commits, and an
    edit of the first message restores its shared prefix from the last turn's (llama.cpp: read whole, cropped)."""
    cache = backend.cache(tmp_path / "kv")
    first = prompt = tokens(120, seed=11)
    for turn in range(3):
        _, generated = backend.run(cache, prompt, f"t{turn}", generate=3)
        cache.flush()
        prompt = prompt + tuple(generated) + tokens(30, seed=20 + turn)
    assert (cache.stats().ssd.snapshots, cache.stats().ssd.superseded) == (1, 2)
    cache.close()
    restarted = backend.cache(tmp_path / "kv")
    assert [e.id for e in restarted.entries()] == ["t2"]
    lease, logits = backend.ask(restarted, first[:100] + (4095, 31))
    assert (lease.tier, lease.cached_tokens) == ("ssd", 100)
    backend.assert_restored_exactly(lease, logits)
    restarted.check_integrity()
    restarted.close()


def test_restores_slower_than_recompute_are_skipped(backend, tmp_path) -> None:
    prompt = tokens(200)
    cache = _on_ssd_only(backend, tmp_path, prompt, "a")
    cache.observe_prefill(1000, 1e-6)  # a machine where prefill is nearly free...
    cache.cost.observe_restore(1000, 1.0)  # ...and reading is slow
    lease, _ = backend.ask(cache, prompt + (1,))
    assert lease.tier == "cold" and cache.stats().ssd_not_worth_it == 1
    cache.close()


def test_a_restore_sparing_a_few_tokens_is_not_worth_its_fixed_cost(backend, tmp_path) -> None:
    # a restore costs something whatever its size (kvcache/cost.py): one that spares 9 tokens of prefill is not
    # worth it, one that spares the whole prompt still is
    prompt = tokens(200)
    cache = _on_ssd_only(backend, tmp_path, prompt, "a")
    cache.observe_prefill(1000, 1.0)  # 1 ms a token
    for nbytes in (1 << 20, 100 << 20) * 3:  # 50 ms a restore, whatever its size, then 10 GB/s
        cache.cost.observe_restore(nbytes, 0.05 + nbytes * 1e-10)
    lease, _ = backend.ask(cache, prompt[:9] + (1,))
    assert lease.tier == "cold" and cache.stats().ssd_not_worth_it == 1
    lease, _ = backend.ask(cache, prompt + (1,))
    assert (lease.tier, lease.cached_tokens) == ("ssd", 200)
    cache.close()


# ---------------------------------------------------------------- near misses

EDITED = 4095  # a token tokens() never draws: the shared prefix ends exactly at the edit
# (cached sequence length, tokens shared before the edit, whether that is a near miss): each rule one token either
# side of its edge — 1023 vs 1024 shared tokens (both over 90%); exactly 90% of 1140 vs just over (both over 1024)
NEAR_MISS_EDGES = [(1100, 1023, False), (1100, 1024, True), (1140, 1026, False), (1140, 1027, True)]


def edited(cached: tuple[int, ...], shared: int) -> tuple[int, ...]:
    return cached[:shared] + (EDITED,) + cached[shared + 1:]


@pytest.mark.parametrize("tier", ["device", "ssd"])
@pytest.mark.parametrize("length,shared,expected", NEAR_MISS_EDGES)
def test_near_misses_are_recorded_exactly_at_their_edges(backend, tmp_path, tier, length, shared, expected) -> None:
    """On the SSD tier: after a restart (a new cache over the same directory, its device tier empty)."""
    cached = tokens(length)
    cache = backend.cache(tmp_path / "kv" if tier == "ssd" else None)
    backend.run(cache, cached, "orig")
    if tier == "ssd":
        cache.close()
        cache = backend.cache(tmp_path / "kv")
    lease, _ = backend.ask(cache, edited(cached, shared))
    assert (lease.tier, lease.cached_tokens) == (tier, shared)
    misses = cache.near_misses()
    if expected:
        (miss,) = misses
        assert (miss.entry_id, miss.tier, miss.divergence, miss.in_prompt) == ("orig", tier, shared, True)
        assert lease.near_miss == miss
    else:
        assert misses == [] and lease.near_miss is None
    cache.close()


def test_a_near_miss_says_what_diverged_and_names_its_segment_only_when_recorded(backend, cache) -> None:
    cached = tokens(1200)
    backend.run(cache, cached, "orig")
    decode = raw_decoder(backend.loaded.tokenizer, skip_special_tokens=False)  # what build_prefix_cache injects
    asked: list[int] = []

    def describe(index: int) -> str:
        asked.append(index)
        return f"message {index // 100} (user)"

    assert backend.ask(cache, cached[:600] + tokens(20, seed=3), describe=describe)[0].near_miss is None
    assert backend.ask(cache, cached, describe=describe)[0].near_miss is None  # a full hit
    assert backend.ask(cache, cached[:1190], describe=describe)[0].near_miss is None  # a prefix of it: a full hit
    assert asked == [], "the describer runs only for a recorded near miss"
    miss = backend.ask(cache, edited(cached, 1130), describe=describe)[0].near_miss
    assert (miss.entry_id, miss.divergence, miss.segment, asked) == ("orig", 1130, "message 11 (user)", [1130])
    assert miss.request_after.startswith(decode([EDITED])) and miss.entry_after.startswith(decode(cached[1130:1131]))
    assert miss.before.endswith(decode(cached[1129:1130]))

    def broken(index: int) -> str:
        raise RuntimeError("template exploded")

    assert backend.ask(cache, cached[:1140] + (EDITED,), describe=broken)[0].near_miss.segment is None
    assert backend.ask(cache, cached[:1150] + (EDITED,))[0].near_miss.segment is None  # no describer
    assert len(cache.near_misses()) == 3


# ---------------------------------------------------------------- damage to the SSD tier

# what each damage does to the tier directory (tests/support/snapshot_damage.py)
DAMAGE = {**BLOB_DAMAGE, **INDEX_DAMAGE}
CONVERSATIONS = (tokens(300, seed=11), tokens(300, seed=12))  # no prefix worth a restore in common
LATER = tokens(300, seed=13)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damage_is_set_aside_and_served_cold(backend, tmp_path, damage, caplog) -> None:
    """The tier holds two conversations; after the damage and a restart the first is asked again. The cache
    opens, never serves the damaged snapshot (the prompt runs cold and its logits are a cold prefill's), says
    what it set aside (stats, log, the lease's `rejected` when found at read), keeps the blob in quarantine/
    (never deleted for damage), and writes go on."""
    cache = backend.cache(tmp_path / "kv")
    for n, conversation in enumerate(CONVERSATIONS):
        backend.run(cache, conversation, f"c{n}")
    cache.close()  # drains the writer: both on disk
    directory = backend.tier_dir(tmp_path / "kv")
    assert len(blobs(directory)) == 2, "both conversations were written: the damage has something to hit"
    DAMAGE[damage](directory)

    with caplog.at_level(logging.WARNING, logger="zllm.kvcache"):
        restarted = backend.cache(tmp_path / "kv")
        lease, logits = backend.ask(restarted, CONVERSATIONS[0])
    stats = restarted.stats()
    assert (lease.tier, lease.cached_tokens, stats.ssd_hits) == ("cold", 0, 0), "the damaged snapshot was served"
    backend.assert_restored_exactly(lease, logits)
    quarantine = [p.name for p in (directory / "quarantine").iterdir()]
    if damage in INDEX_DAMAGE:
        assert stats.ssd.index_set_aside == 1 and any(name.startswith("index.sqlite.") for name in quarantine)
    else:
        assert stats.ssd.quarantined >= 1
        assert damage == "missing" or quarantine, "the damaged blob is kept for inspection, not deleted"
    assert "set aside" in caplog.text or "quarantined" in caplog.text
    if stats.ssd_rejected:  # found at read, not at open: the request's own trace line says why it ran cold
        assert lease.rejected and "set aside" in lease.rejected
    backend.run(restarted, LATER, "later")
    restarted.flush()
    assert "later" in {e.id for e in restarted.entries() if e.tier == "ssd"}, "writes go on after the damage"
    restarted.close()


def test_a_side_request_between_turns_leaves_the_next_turn_exact(backend, cache) -> None:
    # llama.cpp parks the idle conversation in host RAM while the side request runs (engine/llamacpp/kv.py) and
    # brings it back for the next turn: the hit must still equal a full prefill
    main = tokens(300, seed=11)
    _, generated = backend.run(cache, main, "main", generate=3)
    side, _ = backend.run(cache, tokens(80, seed=12), "side", generate=2)
    assert side.tier == "cold"
    if backend.name == "llamacpp":
        assert cache.kv.parks == 1 and cache.kv.parked_bytes > 0, "the side request parked the conversation"
    cache.check_integrity()
    turn2 = main + tuple(generated) + tokens(15, seed=13)
    lease, logits = backend.ask(cache, turn2)
    assert (lease.tier, lease.cached_tokens) == ("device", len(main) + 2)
    backend.assert_restored_exactly(lease, logits, pieces=(len(main), 1, 1))
    if backend.name == "llamacpp":  # back in the pool; the side entry parked in its place
        assert (cache.kv.unparks, cache.kv.parks) == (1, 2)


def test_a_short_shared_prefix_parks_the_long_sequence_it_came_from(backend, cache) -> None:
    # llama.cpp attends every pool cell up to the highest used one: a prompt that shares only its opening tokens
    # with a long kept conversation parks it (engine/llamacpp/kv.py, LlamaKV.share) instead of prefilling beside
    # it; both the request and the conversation's next turn still equal a full prefill
    if backend.name != "llamacpp":
        pytest.skip("parking is llama.cpp's (its pool attends over every kept cell)")
    main = tokens(600, seed=21)
    backend.run(cache, main, "main")
    lease, logits = backend.ask(cache, main[:20] + tokens(100, seed=22))
    assert (lease.tier, lease.cached_tokens) == ("device", 20)
    assert (cache.kv.parks, cache.kv.parked_bytes > 0) == (1, True), "the 580 cells past the prefix left the pool"
    backend.assert_restored_exactly(lease, logits)
    cache.check_integrity()
    lease, logits = backend.ask(cache, main + tokens(10, seed=23))
    assert (lease.tier, lease.cached_tokens, cache.kv.unparks) == ("device", len(main), 1)
    backend.assert_restored_exactly(lease, logits)


def test_a_conversation_exported_for_its_snapshot_parks_without_another_export(backend, tmp_path) -> None:
    # llama.cpp exports a finished turn for the SSD tier and, when a side request comes next, would export it again
    # to park it (engine/llamacpp/kv.py): the snapshot's copy is parked instead, and a sequence brought back from
    # RAM keeps its bytes for the next park; the next turn still equals a full prefill
    if backend.name != "llamacpp":
        pytest.skip("parking is llama.cpp's (its pool attends over every kept cell)")
    cache = backend.cache(tmp_path / "kv")
    main = tokens(300, seed=31)
    backend.run(cache, main, "main")
    assert cache.kv.copied_bytes > 0, "the snapshot's export stayed with the kept conversation"
    backend.run(cache, tokens(60, seed=32), "side")
    assert (cache.kv.parks, cache.kv.park_exports) == (1, 0)
    lease, logits = backend.ask(cache, main + tokens(10, seed=33))  # main back from RAM, the side entry parked
    assert (lease.tier, lease.cached_tokens, cache.kv.unparks) == ("device", len(main), 1)
    backend.assert_restored_exactly(lease, logits)
    backend.run(cache, tokens(60, seed=34), "side2")  # main parked again, from the bytes it came back from
    assert (cache.kv.parks, cache.kv.park_exports) == (3, 0)
    cache.check_integrity()
    cache.close()


def test_nothing_is_parked_beyond_its_ram_budget(backend, tmp_path) -> None:
    if backend.name != "llamacpp":
        pytest.skip("parking is llama.cpp's (its pool attends over every kept cell)")
    cache = backend.cache(park_budget_bytes=0)
    backend.run(cache, tokens(200, seed=14), "main")
    backend.run(cache, tokens(50, seed=15), "side")
    assert cache.kv.parks == 0 and cache.kv.parked_bytes == 0 and len(cache.entries()) == 2
    cache.check_integrity()
    cache.close()
    cache = backend.cache(tmp_path / "kv", park_budget_bytes=100 * backend.bytes_per_token)  # < one export
    backend.run(cache, tokens(200, seed=14), "main")
    assert cache.kv.copied_bytes == 0, "the 200-token conversation's export is past the budget: not held"
    backend.run(cache, tokens(50, seed=15), "side")
    assert cache.kv.parks == 0, "nor parked"
    assert 0 < cache.kv.copied_bytes < 100 * backend.bytes_per_token, "only the side entry's small export is held"
    cache.check_integrity()
    cache.close()
