"""`TorchKV`: the torch backend's side of the prefix cache (kvcache/kv_interface.py).

A running sequence is a set of pooled working buffers (pool.py: `[1, kv_heads, capacity, head_dim]` per tensor);
a kept handle is a node of a per-namespace span tree (radix.py: each node owns the tensors of its own token span,
so entries sharing a prefix share its bytes). Sharing a kept prefix copies its spans into working buffers; keeping
a finished request clones the span past what the tree holds. The SSD tier (kvcache/snapshot_store.py) stores a sequence
token-major, so a restore reads only the token range it lacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from zllm.engine.torch.cache.pool import BufferPool
from zllm.engine.torch.cache.radix import Node, RadixTree
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
        self.bytes_per_token = self.token_bytes = layout.bytes_per_token
        self.snapshot_layout = layout.key
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

    # ------------------------------------------------------------------ the SSD tier: token-major bytes

    def export(self, kept: Span | None, state: KVState, length: int):
        """The writer gets the tree's spans (immutable once inserted: no copy here) or its own copy of the
        working buffers (reused by the next request); it serialises them on its thread."""
        if kept is not None:
            sources = tuple(node.kv for node in kept.node.path())
        else:
            sources = (clone_state(slice_state(state, 0, length)),)
        return partial(token_major_bytes, sources, length)

    def load(self, running: KVState, payload, first: int, length: int, stored: int) -> KVState:
        """Tokens [first, length) into the running buffers. Under inference mode: the working buffers were
        made under it, and only inference mode may update them in place."""
        rows = torch.frombuffer(payload, dtype=torch.uint8).view(length - first, self.bytes_per_token)
        column = 0
        with torch.inference_mode():
            for layer, specs in zip(running, self.layout.layers):
                for target, spec in zip(layer, specs):
                    tensor = rows[:, column:column + spec.row_bytes].contiguous().view(spec.dtype)
                    target[..., first:length, :].copy_(tensor.view(length - first, *spec.row_shape).movedim(0, -2))
                    column += spec.row_bytes
        return running


def token_major_bytes(sources: tuple[KVState, ...], length: int) -> memoryview:
    """The first `length` tokens of the concatenated spans as one token-major payload: token t's row of every
    layer's k and v, back to back (what `load` reads, kvcache/snapshot_frame.py's `token_bytes`)."""
    columns = []
    for layer in range(len(sources[0])):
        for i in range(len(sources[0][layer])):
            tensor = torch.cat([span[layer][i].cpu() for span in sources], dim=-2)[..., :length, :]
            columns.append(tensor.movedim(-2, 0).contiguous().view(length, -1).view(torch.uint8))
    return memoryview(torch.cat(columns, dim=1).numpy()).cast("B")
