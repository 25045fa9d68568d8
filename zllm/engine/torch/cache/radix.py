"""A radix tree over token sequences whose nodes own the KV of their own token span (one tree per namespace).

    root ─ [sys prompt + tools … 12000 tok] ─┬─ [turn 1 … 800 tok] ─┬─ [turn 2 … 600 tok]   ← entry (A, round 2)
                                              │                      └─ [tail of turn 1's output] ← entry (A, round 1)
                                              └─ [other session … 900 tok]                  ← entry (B, round 1)

A node's KV tensors cover exactly its span: `[1, kv_heads, len(node.tokens), head_dim]` per tensor, either owned
(cloned: freeing the node frees its bytes) or a view of a kept working set at the node's own positions (`backing`,
backing.py: the set's bytes count once for all its viewers, and go when the last viewer goes). Branches share their
ancestors' nodes; a path's KV is the concatenation of its nodes' spans. Policy (what to keep, what to evict, which
working set to keep whole) lives in kv.py, kvcache/prefix_cache.py and entry_graph.py; this file only keeps the
structure right:

- children are keyed by their first token, so a parent has at most one child per next token;
- a node's `start` is the global index of its first token (its parent's start + parent span length);
- a node stays only while something needs it: a child or an entry ending at it (a running request holds its own
  working set, never a node);
- a view node is among its backing's viewers, an owned one counts in the tree's `bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zllm.engine.torch.cache.backing import Backing
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
    backing: Backing | None = None  # the kept working set `kv` is a view of; None: `kv` is owned
    nbytes: int = 0  # bytes it owns (0 for a view: its backing counts them)

    def __post_init__(self) -> None:
        assert (self.parent is None) == (self.kv is None) == (not self.tokens), "only the root is empty"
        if self.kv is not None:
            assert seq_len(self.kv) == len(self.tokens), "a node's KV covers exactly its span"
            self.nbytes = storage_bytes(state_tensors(self.kv)) if self.backing is None else 0
        if self.backing is not None:
            self.backing.viewers.add(self)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def needed(self) -> bool:
        return self.is_root or bool(self.children) or bool(self.entries)

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

    def insert(self, tokens: tuple[int, ...], working: KVState, backing: Backing | None = None) -> tuple[Node, int]:
        """Make `tokens` a node boundary, taking the spans not yet present from `working` (covers [0, n)): as views
        of `backing` (the working set `working` lives in) when given, else cloned.

        Returns (the node ending at len(tokens), bytes the tree now owns more). `tokens` must be non-empty.
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
            kv = slice_state(backing.buffers if backing else working, pos, len(tokens))
            node = self._add_child(node, tokens[pos:], kv if backing else clone_state(kv), backing)
        return node, self.bytes - before

    def split(self, node: Node, at: int) -> Node:
        """Cut `node` after `at` tokens; returns the new upper node.

        The lower part stays the same object, keeping children and entries, so holders of a reference to it
        (entry handles) stay valid. A view splits into two views of its backing (no copy); an owned span is cloned
        into two (each owns exactly its bytes)."""
        assert 0 < at < len(node.tokens) and node.kv is not None and node.parent is not None
        own = node.backing is None
        upper_kv, lower_kv = slice_state(node.kv, 0, at), slice_state(node.kv, at, len(node.tokens))
        if own:
            upper_kv, lower_kv = clone_state(upper_kv), clone_state(lower_kv)
        upper = Node(tokens=node.tokens[:at], kv=upper_kv, parent=node.parent, start=node.start,
                     backing=node.backing)
        self.bytes -= node.nbytes
        node.parent.children[upper.tokens[0]] = upper
        node.tokens, node.kv, node.parent, node.start = node.tokens[at:], lower_kv, upper, node.start + at
        node.nbytes = storage_bytes(state_tensors(lower_kv)) if own else 0
        upper.children[node.tokens[0]] = node
        self.bytes += upper.nbytes + node.nbytes
        return upper

    def collect(self, node: Node) -> list[Node]:
        """Free `node` and then its ancestors while nothing needs them; returns the nodes freed."""
        freed = []
        while not node.needed:
            parent = node.parent
            assert parent is not None
            del parent.children[node.tokens[0]]
            if node.backing is not None:
                node.backing.viewers.discard(node)
            self.bytes -= node.nbytes
            node.parent, node.kv = None, None
            freed.append(node)
            node = parent
        return freed

    def own(self, node: Node) -> None:
        """Make a view node own a clone of its span (its backing is about to be written past it, or freed)."""
        assert node.backing is not None and node.kv is not None
        node.backing.viewers.discard(node)
        node.kv, node.backing = clone_state(node.kv), None
        node.nbytes = storage_bytes(state_tensors(node.kv))
        self.bytes += node.nbytes

    def view(self, node: Node, backing: Backing) -> None:
        """Point a node at `backing`'s copy of its span (the same tokens at the same positions): its own clone, or
        its view of another backing, can go."""
        if node.backing is not None:
            node.backing.viewers.discard(node)
        self.bytes -= node.nbytes
        node.kv, node.backing, node.nbytes = slice_state(backing.buffers, node.start, node.end), backing, 0
        backing.viewers.add(node)

    def nodes(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _add_child(self, parent: Node, tokens: tuple[int, ...], kv: KVState, backing: Backing | None) -> Node:
        assert tokens[0] not in parent.children, "the match would have followed an existing child"
        child = Node(tokens=tokens, kv=kv, parent=parent, start=parent.end, backing=backing)
        parent.children[tokens[0]] = child
        self.bytes += child.nbytes
        return child
