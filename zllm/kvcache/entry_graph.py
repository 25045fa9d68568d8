"""The prefix cache's shared-prefix graph: kept entries in per-namespace token tries, backend-neutral.

    root ─ [sys prompt + tools … 12000 tok] ─┬─ [turn 1 … 800 tok] ─┬─ [turn 2 … 600 tok]   ← entry (A, round 2)
                                              │                      └─ [tail of turn 1's output] ← entry (A, round 1)
                                              └─ [other session … 900 tok]                  ← entry (B, round 1)

An *entry* is one finished request's token sequence (prompt + output fed forward) ending at a node boundary,
holding an opaque handle on its KV (`kv`: whatever the backend's KV interface kept — kv_interface.py). Nodes here
hold tokens only; where the KV of a shared span lives is the backend's business (torch: its own span tree;
llama.cpp: the engine's sequences). A node lives exactly as long as some entry ends at or below it.

- **Lookup**: the longest prefix of a request any entry shares, the entry to share it from (a verified hint's
  first), and the best diverging candidate (the largest fraction of itself shared) for lineage and near misses.
- **Rounds.** An entry whose prompt contained the whole *prompt* of an earlier entry continues its
  conversation, one round later; only the newest `rounds` rounds of a conversation are kept.

Which entry to evict is the cache's choice (prefix_cache.py, by retention.py); `drop` is called for each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zllm.token_prefix import common_prefix_length

MAX_ENTRIES = 4096  # zero-byte duplicates (identical retries) must not accumulate without bound


@dataclass(eq=False)
class Node:
    tokens: tuple[int, ...]  # this node's own span; empty only for the root
    parent: Node | None
    start: int  # global index of tokens[0]
    children: dict[int, Node] = field(default_factory=dict)
    entries: set[str] = field(default_factory=set)  # ids of entries whose sequence ends exactly here

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def path(self) -> list[Node]:
        """Root-exclusive path from the top down to this node."""
        nodes, node = [], self
        while node is not None and node.parent is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def sequence(self) -> tuple[int, ...]:
        return tuple(t for node in self.path() for t in node.tokens)

    def subtree(self) -> list[Node]:
        out, stack = [], [self]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out


@dataclass(eq=False)
class Entry:
    id: str
    namespace: str
    node: Node
    kv: Any  # the backend's kept handle (kv_interface.KVSequences.keep)
    prompt_length: int  # tokens of the sequence that were prompt; the rest was generated
    conversation: str
    round: int
    hint_key: str | None = None
    created: float = field(default_factory=time.time)  # wall clock, for listings and prune by age
    last_used: float = field(default_factory=time.monotonic)
    hits: int = 0
    users: int = 0  # acquires about to share from it (evicted last)

    def __post_init__(self) -> None:
        assert self.round >= 1 and 0 <= self.prompt_length <= self.length

    @property
    def length(self) -> int:
        return self.node.end

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.node.sequence()


@dataclass(frozen=True)
class Candidate:
    """An entry compared with a looked-up sequence: they share exactly `matched` leading tokens."""

    entry: Entry
    matched: int

    @property
    def fraction(self) -> float:
        return self.matched / self.entry.length

    @property
    def continues(self) -> bool:
        """The sequence contains the entry's whole prompt: the next turn of that entry's conversation."""
        return self.matched >= self.entry.prompt_length


@dataclass(frozen=True)
class Lookup:
    length: int  # tokens of the request some entry shares
    source: Entry | None  # the entry to share them from (None when length is 0)
    hint_verified: bool = False
    best: Candidate | None = None  # the entry diverged from with the largest shared fraction


class EntryGraph:
    def __init__(self, rounds: int, drop: Callable[[Entry], None], *, clock: Callable[[], float] = time.monotonic):
        """`drop(entry)`: an entry left the graph (its KV handle is the caller's to free)."""
        assert rounds >= 1
        self.rounds = rounds
        self._drop = drop
        self._clock = clock
        self.roots: dict[str, Node] = {}
        self.entries: dict[str, Entry] = {}
        self._hints: dict[tuple[str, str], str] = {}  # (namespace, client key) → newest entry id

    def now(self) -> float:
        return self._clock()

    # ------------------------------------------------------------------ lookup

    def lookup(self, namespace: str, tokens: tuple[int, ...], hint: str | None = None) -> Lookup:
        root = self.roots.get(namespace)
        if root is None:
            return Lookup(0, None)
        steps = _match(root, tokens)
        length = sum(take for _, take in steps)
        hinted = self._hinted_entry(namespace, hint)
        verified = hinted is not None and length >= hinted.length and any(
            n is hinted.node and take == len(n.tokens) for n, take in steps)
        source = hinted if verified else self._newest_below(steps[-1][0]) if steps else None
        return Lookup(length, source, verified, self._best_candidate(steps, length))

    def touch(self, entry: Entry) -> None:
        entry.last_used = self._clock()
        entry.hits += 1

    # ------------------------------------------------------------------ insert and drop

    def insert(self, namespace: str, tokens: tuple[int, ...], kv: Any, *, entry_id: str, prompt_length: int,
               lineage: Entry | None = None, hint_key: str | None = None) -> Entry:
        """Keep `tokens` (KV in the handle `kv`) as an entry; old rounds of its conversation go."""
        assert tokens and entry_id not in self.entries
        node = self._make_boundary(self.roots.setdefault(namespace, Node((), None, 0)), tokens)
        conversation, round_ = (lineage.conversation, lineage.round + 1) if lineage else (entry_id, 1)
        entry = Entry(entry_id, namespace, node, kv, min(prompt_length, len(tokens)), conversation, round_, hint_key)
        node.entries.add(entry_id)
        entry.last_used = self._clock()
        self.entries[entry_id] = entry
        if hint_key:
            self._hints[(namespace, hint_key)] = entry_id
        stale = [e for e in self.entries.values()
                 if e.conversation == entry.conversation and e.round <= entry.round - self.rounds]
        for old in stale:
            self.drop(old)
        while len(self.entries) > MAX_ENTRIES:
            self.drop(min((e for e in self.entries.values() if e is not entry), key=lambda e: e.last_used))
        return entry

    def drop(self, entry: Entry) -> None:
        del self.entries[entry.id]
        if self._hints.get((entry.namespace, entry.hint_key or "")) == entry.id:
            del self._hints[(entry.namespace, entry.hint_key or "")]
        node = entry.node
        node.entries.discard(entry.id)
        while node.parent is not None and not node.children and not node.entries:
            del node.parent.children[node.tokens[0]]
            node = node.parent
        if node.parent is None and not node.children:
            self.roots.pop(entry.namespace, None)
        self._drop(entry)

    def prefixes_of(self, namespace: str, tokens: tuple[int, ...]) -> list[Entry]:
        """Entries whose whole sequence is a prefix of `tokens` (a newer, longer state supersedes them)."""
        root = self.roots.get(namespace)
        if root is None:
            return []
        return [self.entries[i] for node, take in _match(root, tokens) if take == len(node.tokens)
                for i in node.entries]

    def check_integrity(self) -> None:
        """The graph's invariants from scratch: links agree both ways, spans follow their parents, no node lives
        that no entry needs, each entry ends on its own namespace's node, hints name live entries."""
        for namespace, root in self.roots.items():
            assert root.children, f"empty tree kept for {namespace}"
            for node in root.subtree()[1:]:
                assert node.parent.children.get(node.tokens[0]) is node and node.start == node.parent.end
                assert node.children or node.entries, "a node no entry needs was not freed"
                assert all(self.entries[i].node is node and self.entries[i].namespace == namespace
                           for i in node.entries)
        for entry in self.entries.values():
            assert entry.node.path()[0].parent is self.roots[entry.namespace], "entry is attached"
        for (namespace, _), entry_id in self._hints.items():
            assert self.entries[entry_id].namespace == namespace

    # ------------------------------------------------------------------ internals

    def _make_boundary(self, root: Node, tokens: tuple[int, ...]) -> Node:
        steps = _match(root, tokens)
        node, pos = root, sum(take for _, take in steps)
        if steps:
            node, take = steps[-1]
            if take < len(node.tokens):
                node = _split(node, take)
        if pos < len(tokens):
            child = Node(tokens[pos:], node, node.end)
            node.children[child.tokens[0]] = child
            node = child
        return node

    def _hinted_entry(self, namespace: str, hint: str | None) -> Entry | None:
        if not hint:
            return None
        entry = self.entries.get(hint) or self.entries.get(self._hints.get((namespace, hint), ""))
        return entry if entry is not None and entry.namespace == namespace else None

    def _newest_below(self, node: Node) -> Entry:
        """The most recently used entry whose sequence runs through `node` (one always does)."""
        return max((self.entries[i] for n in node.subtree() for i in n.entries), key=lambda e: e.last_used)

    def _best_candidate(self, steps: list[tuple[Node, int]], length: int) -> Candidate | None:
        """The entry sharing the largest fraction of itself with the matched path, ties to the longer match."""
        best: Candidate | None = None
        for node, take in steps:
            for entry_id in node.entries if take == len(node.tokens) else ():
                best = _better(best, Candidate(self.entries[entry_id], node.start + take))
        if steps:
            for node in steps[-1][0].subtree():
                for entry_id in node.entries:
                    if self.entries[entry_id].length > length:
                        best = _better(best, Candidate(self.entries[entry_id], length))
        return best


def _match(root: Node, tokens: tuple[int, ...]) -> list[tuple[Node, int]]:
    """The longest path prefix of `tokens`: (node, take) pairs, every take full except maybe the last."""
    steps, node, pos = [], root, 0
    while pos < len(tokens) and (child := node.children.get(tokens[pos])) is not None:
        take = common_prefix_length(child.tokens, tokens[pos:pos + len(child.tokens)])
        steps.append((child, take))
        pos += take
        if take < len(child.tokens):
            break
        node = child
    return steps


def _split(node: Node, at: int) -> Node:
    """Cut `node` after `at` tokens; returns the new upper node (the lower keeps its identity and entries)."""
    upper = Node(node.tokens[:at], node.parent, node.start)
    node.parent.children[upper.tokens[0]] = upper
    node.tokens, node.parent, node.start = node.tokens[at:], upper, node.start + at
    upper.children[node.tokens[0]] = node
    return upper


def _better(best: Candidate | None, other: Candidate) -> Candidate:
    if best is None or (other.fraction, other.matched) > (best.fraction, best.matched):
        return other
    return best
