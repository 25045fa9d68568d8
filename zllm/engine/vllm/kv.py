"""`RemoteKV`: the prefix cache's KV interface (kvcache/kv_interface.py) for an engine that keeps the KV itself.

vLLM holds the KV (its own block cache, keyed by `cache_salt` and the tokens); zllm holds no cells. The one prefix
cache (kvcache/prefix_cache.py) still runs over this interface so that it can be zllm's index of the token
sequences sent per namespace: `cache ls`, near misses and explain-miss answer on vLLM as on the local engines.
So every handle here is bookkeeping: a running sequence is its room in tokens, a kept handle its length.

Bytes are an estimate (`bytes_per_token`, from the model's config: K and V for every layer's KV heads at 2 bytes),
against the budget zllm gave vLLM's KV: the index forgets roughly what vLLM's LRU would. It is never exact — vLLM
shares blocks between sequences and evicts on its own — which is why usage's `cached_tokens` stays vLLM's figure.
No SSD tier: vLLM's KV offloading is its own (and CUDA-only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class RemoteSequence:
    """A running request's room (tokens), or a finished one's kept length: the only state zllm has of it."""

    tokens: int


def kv_bytes_per_token(config: dict) -> int:
    """K and V of every layer for one token, at 2 bytes (vLLM's bf16/fp16 KV); 1 when the config does not say."""
    text = config.get("text_config") or config
    layers = int(text.get("num_hidden_layers") or 0)
    heads = int(text.get("num_attention_heads") or 0)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or (int(text.get("hidden_size") or 0) // heads if heads else 0))
    return max(1, 2 * layers * kv_heads * head_dim * 2)


class RemoteKV:
    shares_prefixes = False  # counted per entry: a newer turn supersedes the entry it extends (an estimate)

    def __init__(self, bytes_per_token: int):
        self.bytes_per_token = bytes_per_token
        self._running: set[RemoteSequence] = set()
        self._kept: set[RemoteSequence] = set()

    # ------------------------------------------------------------------ running sequences

    def room_bytes(self, tokens: int) -> int:
        return tokens * self.bytes_per_token

    def bytes_to_open(self, tokens: int) -> int:
        return 0  # vLLM's pool, not this budget's

    def open(self, tokens: int) -> RemoteSequence:
        running = RemoteSequence(tokens)
        self._running.add(running)
        return running

    def share(self, kept: RemoteSequence, length: int, tokens: int) -> RemoteSequence:
        return self.open(tokens)  # vLLM finds the shared blocks itself (same salt, same tokens)

    def release(self, running: RemoteSequence, buffers: Any = None, *, kept: bool = False) -> None:
        self._running.discard(running)

    def end_reservation(self, running: RemoteSequence) -> None:
        self._running.discard(running)

    def short_of_sequences(self) -> bool:
        return False

    # ------------------------------------------------------------------ kept handles

    def new_bytes(self, namespace: str, tokens: tuple[int, ...]) -> int:
        return len(tokens) * self.bytes_per_token

    def keep(self, namespace: str, tokens: tuple[int, ...], state: Any, running: Any, entry_id: str
             ) -> RemoteSequence:
        kept = RemoteSequence(len(tokens))
        self._kept.add(kept)
        return kept

    def drop(self, kept: RemoteSequence) -> None:
        self._kept.discard(kept)

    def close(self) -> None:
        self._kept.clear()

    def length(self, kept: RemoteSequence) -> int:
        return kept.tokens

    def held_bytes(self) -> int:
        return sum(k.tokens for k in self._kept) * self.bytes_per_token

    def exclusive_bytes(self, kept: RemoteSequence) -> int:
        return kept.tokens * self.bytes_per_token

    def pool_bytes(self) -> int:
        return 0

    def reserved_bytes(self) -> int:
        """Room of the requests in flight (zero when none runs: a lease not given back shows here)."""
        return sum(r.tokens for r in self._running) * self.bytes_per_token

    def check(self, kept: RemoteSequence, length: int) -> None:
        assert kept in self._kept and kept.tokens == length, "a kept handle lost its length"

    # ------------------------------------------------------------------ no SSD tier

    def open_ssd_store(self, config: Any) -> Any:
        raise NotImplementedError("the remote engine keeps its own KV: zllm has no SSD tier for it")

    def ssd_lookup(self, store, namespace, prompt, hint):
        return None, None

    def ssd_cut(self, match, length):
        raise NotImplementedError

    def restore_bytes(self, match, skip):
        raise NotImplementedError

    def ssd_read(self, store, running, match, skip):
        raise NotImplementedError

    def ssd_load(self, store, running, match, read):
        raise NotImplementedError

    def snapshot_job(self, **job):
        raise NotImplementedError
