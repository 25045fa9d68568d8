"""`TorchKV`: the torch backend's side of the prefix cache (kvcache/kv_interface.py).

A running sequence is a set of pooled working buffers (pool.py: `[1, kv_heads, capacity, head_dim]` per tensor);
a kept handle is a node of a per-namespace span tree (radix.py: each node owns the tensors of its own token span,
so entries sharing a prefix share its bytes). Sharing a kept prefix copies its spans into working buffers; keeping
a finished request clones the span past what the tree holds. The SSD tier stores tensor spans (ssd_tier.py), so a
restore reads only the token range it lacks, straight into the running buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zllm.engine.torch.cache.pool import BufferPool
from zllm.engine.torch.cache.radix import Node, RadixTree
from zllm.engine.torch.cache.ssd_tier import SnapshotJob, SnapshotStore, SsdMatch
from zllm.engine.torch.cache.state import (
    KVLayout,
    KVState,
    clone_state,
    copy_into,
    slice_state,
    state_tensors,
    storage_bytes,
)


@dataclass(eq=False)
class Span:
    """A kept handle: the span-tree node an entry's sequence ends at."""

    namespace: str
    node: Node
    entry_id: str


class TorchKV:
    shares_prefixes = True

    def __init__(self, layout: KVLayout, device: torch.device | str):
        self.layout = layout
        self.bytes_per_token = layout.bytes_per_token
        self.pool = BufferPool(layout, device)
        self.trees: dict[str, RadixTree] = {}

    # ------------------------------------------------------------------ running sequences (engine thread)

    def room_bytes(self, tokens: int) -> int:
        return self.pool.bytes_for(tokens)

    def bytes_to_open(self, tokens: int) -> int:
        """0 when the idle working set is large enough (it is reused as is); else it is freed first."""
        needed = self.pool.bytes_for(tokens)
        if self.pool.idle_bytes() >= needed:
            return 0
        self.pool.discard_idle()
        return needed

    def open(self, tokens: int) -> KVState:
        return self.pool.take(tokens)

    def share(self, kept: Span, length: int, tokens: int) -> KVState:
        """Working buffers with the kept path's first `length` tokens copied in (one memory copy per span)."""
        working = self.pool.take(tokens)
        for node in kept.node.path():
            if node.start >= length:
                break
            copy_into(working, node.start, slice_state(node.kv, 0, min(len(node.tokens), length - node.start)))
        return working

    def release(self, running: KVState, buffers: KVState | None = None, *, kept: bool = False) -> None:
        self.pool.give_back(running, buffers)

    def end_reservation(self, running: KVState) -> None:
        """Working buffers count until they are given back."""

    @staticmethod
    def short_of_sequences() -> bool:
        return False

    # ------------------------------------------------------------------ kept handles

    def new_bytes(self, namespace: str, tokens: tuple[int, ...]) -> int:
        """Bytes a keep of `tokens` would add (the span past the existing path; a split adds ~nothing)."""
        tree = self.trees.get(namespace)
        have = tree.match(tokens).length if tree else 0
        return (len(tokens) - have) * self.bytes_per_token

    def keep(self, namespace: str, tokens: tuple[int, ...], state: KVState, running: KVState, entry_id: str) -> Span:
        node, _ = self.trees.setdefault(namespace, RadixTree()).insert(tokens, state)
        node.entries.add(entry_id)
        return Span(namespace, node, entry_id)

    def drop(self, kept: Span) -> None:
        kept.node.entries.discard(kept.entry_id)
        tree = self.trees.get(kept.namespace)
        if tree is not None and kept.node.parent is not None:
            tree.collect(kept.node)
            if not tree.root.children:
                del self.trees[kept.namespace]

    def close(self) -> None:
        """Nothing deferred."""

    @staticmethod
    def length(kept: Span) -> int:
        return kept.node.end

    def held_bytes(self) -> int:
        return sum(tree.bytes for tree in self.trees.values())

    @staticmethod
    def exclusive_bytes(kept: Span) -> int:
        """Bytes freed if only this handle went: the tail of its path that nothing else needs."""
        node = kept.node
        if node.children or len(node.entries) > 1:
            return 0
        total, current = node.nbytes, node.parent
        while current is not None and not current.is_root and len(current.children) == 1 and not current.entries:
            total += current.nbytes
            current = current.parent
        return total

    def pool_bytes(self) -> int:
        return self.pool.bytes

    def reserved_bytes(self) -> int:
        return self.pool.in_use_bytes()

    def check(self, kept: Span, length: int) -> None:
        """The handle's node ends at `length` in a live tree whose bytes are its tensors' real bytes."""
        tree = self.trees[kept.namespace]
        assert kept.node.end == length and kept.entry_id in kept.node.entries
        assert kept.node.path()[0].parent is tree.root, "the span is attached"
        nodes = tree.nodes()
        for node in nodes:
            assert node.parent.children.get(node.tokens[0]) is node and node.start == node.parent.end
            assert all(t.shape[-2] == len(node.tokens) for t in state_tensors(node.kv)), "a node covers its span"
            assert node.needed, "a node nothing needs was not freed"
        assert tree.bytes == storage_bytes(t for n in nodes for t in state_tensors(n.kv)), "bytes == real bytes"

    # ------------------------------------------------------------------ the SSD tier: tensor spans

    def open_ssd_store(self, config) -> SnapshotStore:
        return SnapshotStore(config.ssd_dir, self.layout, config.ssd_budget_bytes)

    @staticmethod
    def ssd_lookup(store: SnapshotStore, namespace: str, prompt: tuple[int, ...], hint: str | None):
        return store.lookup(namespace, prompt, hint)

    @staticmethod
    def ssd_cut(match: SsdMatch, length: int) -> SsdMatch:
        return SsdMatch(match.row, length, match.hinted)

    def restore_bytes(self, match: SsdMatch, skip: int) -> int:
        return (match.length - skip) * self.bytes_per_token

    def ssd_read(self, store: SnapshotStore, running: KVState, match: SsdMatch, skip: int) -> int:
        """Reads tokens [skip, length) straight into the running buffers; returns bytes read. Under inference
        mode: the working buffers were made under it, and only inference mode may update them in place (the
        restore thread is not the engine thread, which runs in it for its whole life)."""
        with torch.inference_mode():
            return store.restore(match, running, self.pool, skip=skip)

    @staticmethod
    def ssd_load(store: SnapshotStore, running: KVState, match: SsdMatch, read: int) -> tuple[KVState, int]:
        return running, read  # already in place

    def snapshot_job(self, *, entry_id: str, namespace: str, model: str, tokens: tuple[int, ...],
                     prompt_length: int, round: int, hint_key: str | None, kept: Span | None,
                     state: KVState) -> SnapshotJob:
        if kept is not None:  # the tree's spans are immutable once inserted: hand them over without a copy
            sources = tuple((node.start, node.kv) for node in kept.node.path())
        else:  # the working buffers are reused by the next request: the writer gets its own copy
            sources = ((0, clone_state(slice_state(state, 0, len(tokens)))),)
        return SnapshotJob(entry_id, namespace, model, tokens, prompt_length, round, sources, hint_key)
