"""Fixtures for kvcache tests: synthetic KV whose every value says which token and position it belongs to.

No model here: KV for token t at position p is `t + p / 4096` (exact in float32 for t, p < 4096), negated for
values and doubled for layer 1, broadcast over heads and head_dim. So a restored state equals the expected one
exactly iff every span landed at the right place, and two sequences sharing a prefix share that KV exactly,
as a real model's would.
"""

from __future__ import annotations

import random

import pytest
import torch

from zllm.engine.torch.cache.state import KVLayout, KVState

torch.set_num_threads(1)  # 2 shared cores on this machine

KV_HEADS, HEAD_DIM, LAYERS = 2, 16, 2  # the tiny Qwen3's shape: 512 bytes per token in float32


def synthetic_state(tokens, start: int = 0) -> KVState:
    """KV for `tokens` at positions start, start+1, ...: [1, KV_HEADS, n, HEAD_DIM] per tensor."""
    ids = torch.tensor(list(tokens), dtype=torch.float32)
    base = ids + torch.arange(start, start + len(ids), dtype=torch.float32) / 4096  # [n]
    k = base.view(1, 1, -1, 1).expand(1, KV_HEADS, -1, HEAD_DIM).contiguous()
    return tuple((k * (layer + 1), -k * (layer + 1)) for layer in range(LAYERS))


LAYOUT = KVLayout.of(synthetic_state([1]))


def random_tokens(n: int, rng: random.Random | None = None) -> tuple[int, ...]:
    rng = rng or random.Random(0)
    return tuple(rng.randrange(4096) for _ in range(n))


def assert_state_equal(got: KVState, tokens, length: int | None = None) -> None:
    want = synthetic_state(tokens)
    n = len(tokens) if length is None else length
    for got_layer, want_layer in zip(got, want):
        for g, w in zip(got_layer, want_layer):
            assert torch.equal(g[..., :n, :], w[..., :n, :])


@pytest.fixture
def layout() -> KVLayout:
    return LAYOUT


def torch_cache(device_budget_bytes: int = 64 << 20, *, clock=None, decode=None, **config):
    """The one prefix cache over the torch backend's KV (engine/torch/cache/kv.py) with the synthetic layout;
    `clock`: the entry graph's (tests of recency)."""
    from zllm.engine.torch.cache.kv import TorchKV
    from zllm.kvcache import CacheConfig
    from zllm.kvcache.entry_graph import EntryGraph
    from zllm.kvcache.prefix_cache import PrefixCache

    cache = PrefixCache(CacheConfig(device_budget_bytes=device_budget_bytes, **config), TorchKV(LAYOUT, "cpu"),
                        cost_key="cost:test", decode=decode)
    if clock is not None:
        cache.graph = EntryGraph(cache.graph.rounds, cache._drop_kv, clock=clock)
    return cache


def keep(cache, tokens, entry_id: str, *, prompt_length=None, lineage=None, namespace: str = "ns"):
    """What `finish` does with a request's terminal state (synthetic KV for `tokens`), without a running
    sequence: evict to make room, then keep it. Returns the entry, or None when it was not kept."""
    from zllm.cache_views import Tier
    from zllm.kvcache.prefix_cache import Lease

    tokens = tuple(tokens)
    lease = Lease(namespace, tokens + (0,), 0, Tier.COLD, lineage=lineage,
                  round=lineage.round + 1 if lineage is not None else 1)
    with cache._lock:
        return cache._keep(lease, tokens, synthetic_state(tokens), entry_id,
                           len(tokens) if prompt_length is None else prompt_length, None)


def span_bytes(cache) -> int:
    """Real bytes of every tensor the torch KV's span trees hold."""
    from zllm.engine.torch.cache.state import state_tensors, storage_bytes

    return storage_bytes(t for tree in cache.kv.trees.values() for n in tree.nodes() for t in state_tensors(n.kv))


def torch_store(directory, budget_bytes: int = 1 << 30, **kwargs):
    """The one SSD store as the torch backend opens it over the synthetic layout (token-major payloads)."""
    from zllm.kvcache.snapshot_store import SnapshotStore

    return SnapshotStore(directory, LAYOUT.key, budget_bytes, token_bytes=LAYOUT.bytes_per_token, **kwargs)


def torch_job(job_id: str, tokens, *, namespace: str = "ns", prompt_length=None, round_: int = 1,
              hint_key=None):
    """A snapshot job whose payload is the torch backend's export of the synthetic KV for `tokens`."""
    from functools import partial

    from zllm.engine.torch.cache.kv import token_major_bytes
    from zllm.kvcache.snapshot_store import SnapshotJob

    tokens = tuple(tokens)
    return SnapshotJob(job_id, namespace, "model", tokens, len(tokens) if prompt_length is None else prompt_length,
                       round_, partial(token_major_bytes, (synthetic_state(tokens),), len(tokens)), hint_key)


def restore_state(store, match, *, skip: int = 0, room: int = 8) -> KVState:
    """What a restore leaves in a running sequence: the match's tokens [skip, length) read and loaded by the
    torch backend's KV into empty buffers (positions before `skip` stay zero)."""
    from zllm.engine.torch.cache.kv import TorchKV

    dest = LAYOUT.empty(match.length + room)
    payload, first, stored = store.read(match, skip)
    return TorchKV(LAYOUT, "cpu").load(dest, payload, first, match.length, stored)
