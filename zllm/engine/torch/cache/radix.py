"""A radix tree over token sequences whose nodes own the KV of their own token span (one tree per namespace).

    root ─ [sys prompt + tools … 12000 tok] ─┬─ [turn 1 … 800 tok] ─┬─ [turn 2 … 600 tok]   ← entry (A, round 2)
                                              │                      └─ [tail of turn 1's output] ← entry (A, round 1)
                                              └─ [other session … 900 tok]                  ← entry (B, round 1)

A node's KV tensors cover exactly its span: `[1, kv_heads, len(node.tokens), head_dim]` per tensor, owned
(cloned), so freeing a node frees its bytes. Branches share their ancestors' nodes; a path's KV is the
concatenation of its nodes' spans. Policy (what to keep, what to evict) lives in kvcache/prefix_cache.py and entry_graph.py; this file
only keeps the structure right:

- children are keyed by their first token, so a parent has at most one child per next token;
- a node's `start` is the global index of its first token (its parent's start + parent span length);
- a node stays only while something needs it: a child, an entry ending at it, or a running request's lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from zllm.engine.torch.cache.state import (
    KVState,
    clone_state,
    common_prefix_length,
    seq_len,
    slice_state,
    state_tensors,
    storage_bytes,
)


@dataclass(eq=False)
class Node:
    tokens: tuple[int, ...]  # this node's own span; empty only for the root
    kv: KVState | None  # per tensor [1, kv_heads, len(tokens), head_dim]; None only for the root
    parent: Node | None
    start: int  # global index of tokens[0]
    children: dict[int, Node] = field(default_factory=dict)
    entries: set[str] = field(default_factory=set)  # ids of entries whose sequence ends exactly here
    locks: int = 0  # running requests whose restored path includes this node
    last_used: float = field(default_factory=time.monotonic)
    nbytes: int = 0

    def __post_init__(self) -> None:
        assert (self.parent is None) == (self.kv is None) == (not self.tokens), "only the root is empty"
        if self.kv is not None:
            assert seq_len(self.kv) == len(self.tokens), "a node's KV covers exactly its span"
            self.nbytes = storage_bytes(state_tensors(self.kv))

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def needed(self) -> bool:
        return self.is_root or bool(self.children) or bool(self.entries) or self.locks > 0

    def path(self) -> list[Node]:
        """Root-exclusive path from the top down to this node."""
        nodes = []
        node: Node | None = self
        while node is not None and not node.is_root:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def sequence(self) -> tuple[int, ...]:
        return tuple(t for node in self.path() for t in node.tokens)


@dataclass(frozen=True)
class Match:
    """The longest path prefix of a token sequence: `(node, take)` pairs, every take full except maybe the last."""

    steps: tuple[tuple[Node, int], ...]

    @property
    def length(self) -> int:
        return sum(take for _, take in self.steps)

    @property
    def last_node(self) -> Node | None:
        return self.steps[-1][0] if self.steps else None

    def truncated(self, length: int) -> Match:
        """The same path cut to at most `length` tokens (the "prefill at least one token" rule)."""
        steps, left = [], length
        for node, take in self.steps:
            if left <= 0:
                break
            steps.append((node, min(take, left)))
            left -= take
        return Match(tuple(steps))


class RadixTree:
    def __init__(self) -> None:
        self.root = Node(tokens=(), kv=None, parent=None, start=0)
        self.bytes = 0

    def match(self, tokens: tuple[int, ...]) -> Match:
        steps: list[tuple[Node, int]] = []
        node, pos = self.root, 0
        while pos < len(tokens) and (child := node.children.get(tokens[pos])) is not None:
            take = common_prefix_length(child.tokens, tokens[pos:pos + len(child.tokens)])
            steps.append((child, take))
            pos += take
            if take < len(child.tokens):
                break
            node = child
        return Match(tuple(steps))

    def insert(self, tokens: tuple[int, ...], working: KVState) -> tuple[Node, int]:
        """Make `tokens` a node boundary, cloning the spans not yet present from `working` (covers [0, n)).

        Returns (the node ending at len(tokens), bytes added). `tokens` must be non-empty.
        """
        assert tokens and seq_len(working) >= len(tokens), "working KV covers the inserted tokens"
        before = self.bytes
        match = self.match(tokens)
        node = self.root
        if match.steps:
            node, take = match.steps[-1]
            if take < len(node.tokens):
                node = self.split(node, take)
        pos = match.length
        if pos < len(tokens):
            node = self._add_child(node, tokens[pos:], clone_state(slice_state(working, pos, len(tokens))))
        return node, self.bytes - before

    def split(self, node: Node, at: int) -> Node:
        """Cut `node` after `at` tokens; returns the new upper node.

        The lower part stays the same object, keeping children, entries and locks (a lock on it keeps the
        upper alive through the parent link), so holders of a reference to it stay valid."""
        assert 0 < at < len(node.tokens) and node.kv is not None and node.parent is not None
        upper = Node(tokens=node.tokens[:at], kv=clone_state(slice_state(node.kv, 0, at)), parent=node.parent,
                     start=node.start, last_used=node.last_used)
        lower_kv = clone_state(slice_state(node.kv, at, len(node.tokens)))
        self.bytes -= node.nbytes
        node.parent.children[upper.tokens[0]] = upper
        node.tokens, node.kv, node.parent, node.start = node.tokens[at:], lower_kv, upper, node.start + at
        node.nbytes = storage_bytes(state_tensors(lower_kv))
        upper.children[node.tokens[0]] = node
        self.bytes += upper.nbytes + node.nbytes
        return upper

    def collect(self, node: Node) -> int:
        """Free `node` and then its ancestors while nothing needs them; returns bytes freed."""
        freed = 0
        while not node.needed:
            parent = node.parent
            assert parent is not None
            del parent.children[node.tokens[0]]
            node.parent, node.kv = None, None
            freed += node.nbytes
            node = parent
        self.bytes -= freed
        return freed

    def nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _add_child(self, parent: Node, tokens: tuple[int, ...], kv: KVState) -> Node:
        assert tokens[0] not in parent.children, "the match would have followed an existing child"
        child = Node(tokens=tokens, kv=kv, parent=parent, start=parent.end)
        parent.children[tokens[0]] = child
        self.bytes += child.nbytes
        return child
