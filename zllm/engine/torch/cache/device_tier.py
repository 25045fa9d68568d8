"""The device tier: finished requests' terminal states kept resident in per-namespace radix trees.

An *entry* is one finished request's token sequence (prompt + output fed forward) ending at a node boundary.
Entries are what the policy keeps or drops; nodes live exactly as long as some entry (or running request)
needs them, so dropping an entry frees only the span no other entry shares.

Policy:
- **Budget** in real bytes (`RadixTree.bytes`, counted from storages) plus whatever the caller reserves
  (the working cache of the running request). `make_room` evicts entries until the new bytes fit, least
  recently used first except each namespace's main conversation (retention.py): evict first, then admit;
  locked paths are never freed.
- **Rounds.** Entries form conversations: an entry whose prompt contained the whole *prompt* of an earlier
  entry (the match reached into that entry's output) continues its conversation, one round later. Only the
  newest `rounds` rounds of a conversation are kept; older rounds' dead tails (the re-rendered output) go.
- **Candidates.** A lookup reports the best other entry it diverged from — the raw material for lineage,
  the near-miss log and `explain-miss`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from zllm.engine.torch.cache.radix import Match, Node, RadixTree
from zllm.engine.torch.cache.state import KVState, state_tensors, storage_bytes
from zllm.kvcache.retention import Eviction, Newcomer, next_eviction

MAX_ENTRIES = 4096  # zero-byte duplicates (identical retries) must not accumulate without bound


@dataclass(eq=False)
class Entry:
    id: str
    namespace: str
    node: Node
    prompt_length: int  # tokens of the sequence that were prompt; the rest was generated
    conversation: str
    round: int
    hint_key: str | None = None
    created: float = field(default_factory=time.time)  # wall clock, for listings and prune by age
    last_used: float = field(default_factory=time.monotonic)
    hits: int = 0

    def __post_init__(self) -> None:
        assert self.round >= 1 and 0 <= self.prompt_length <= self.length

    @property
    def length(self) -> int:
        return self.node.end


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
class DeviceLookup:
    namespace: str
    match: Match
    hint_verified: bool = False
    # the entry the sequence diverged from with the largest shared fraction (None if none shares a token)
    best: Candidate | None = None

    @property
    def length(self) -> int:
        return self.match.length


class DeviceTier:
    def __init__(self, budget_bytes: int, rounds: int, *, clock: Callable[[], float] = time.monotonic,
                 on_spared: Callable[[Eviction], None] | None = None):
        """`on_spared(eviction)`: called whenever the main-conversation rule kept a state LRU would have evicted."""
        assert budget_bytes >= 0 and rounds >= 1
        self.budget_bytes = budget_bytes
        self.rounds = rounds
        self._clock = clock
        self._on_spared = on_spared
        self.trees: dict[str, RadixTree] = {}
        self.entries: dict[str, Entry] = {}
        self._hints: dict[tuple[str, str], str] = {}  # (namespace, client key) → newest entry id

    @property
    def bytes(self) -> int:
        return sum(tree.bytes for tree in self.trees.values())

    def now(self) -> float:
        """The clock entries' `last_used` is read from."""
        return self._clock()

    # ------------------------------------------------------------------ lookup and locks

    def lookup(self, namespace: str, tokens: tuple[int, ...], hint: str | None = None) -> DeviceLookup:
        tree = self.trees.get(namespace)
        if tree is None:
            return DeviceLookup(namespace, Match(()))
        match = tree.match(tokens)
        hinted = self._hinted_entry(namespace, hint)
        hint_verified = hinted is not None and match.length >= hinted.length and _ends_on(match, hinted.node)
        return DeviceLookup(namespace, match, hint_verified, self._best_candidate(tree, match))

    def lock(self, match: Match) -> Node | None:
        """Pin the matched path while a request uses it. Locking the deepest node suffices: its ancestors
        have a child, so they are needed too — and a later split of any path node keeps the lock valid."""
        now = self._clock()
        for node, _ in match.steps:
            node.last_used = now
        deepest = match.last_node
        if deepest is not None:
            deepest.locks += 1
        return deepest

    def unlock(self, namespace: str, locked: Node | None) -> None:
        if locked is None:
            return
        assert locked.locks > 0, "unlock without lock"
        locked.locks -= 1
        tree = self.trees.get(namespace)
        if tree is not None and locked.parent is not None:  # still attached: free what only the lock kept
            tree.collect(locked)
            if not tree.root.children:
                del self.trees[namespace]

    def touch(self, entry: Entry) -> None:
        entry.last_used = self._clock()
        entry.hits += 1

    # ------------------------------------------------------------------ insert and evict

    def insert(self, namespace: str, tokens: tuple[int, ...], working: KVState, *, entry_id: str,
               prompt_length: int, lineage: Entry | None = None, hint_key: str | None = None,
               reserved: int = 0) -> Entry | None:
        """Keep `tokens` (KV in `working`, covering at least them) as an entry. None if it cannot fit.

        Callers make room first (`make_room(new_bytes(...), reserved)`); an insert never exceeds the budget.
        """
        if not tokens or entry_id in self.entries:
            return None
        if self.bytes + reserved + self.new_bytes(namespace, tokens, working) > self.budget_bytes:
            return None
        tree = self.trees.setdefault(namespace, RadixTree())
        node, _ = tree.insert(tokens, working)
        conversation, round_ = (lineage.conversation, lineage.round + 1) if lineage else (entry_id, 1)
        entry = Entry(entry_id, namespace, node, min(prompt_length, len(tokens)), conversation, round_, hint_key)
        node.entries.add(entry_id)
        node.last_used = entry.last_used = self._clock()
        self.entries[entry_id] = entry
        if hint_key:
            self._hints[(namespace, hint_key)] = entry_id
        self._drop_old_rounds(entry)
        while len(self.entries) > MAX_ENTRIES:
            self.drop(self._lru_entry(exclude=entry).id)
        return entry

    def new_bytes(self, namespace: str, tokens: tuple[int, ...], working: KVState) -> int:
        """Bytes an insert of `tokens` would add (the span past the existing path; a split adds ~nothing)."""
        tree = self.trees.get(namespace)
        have = tree.match(tokens).length if tree else 0
        per_token = sum(t.element_size() * t.numel() // max(t.shape[-2], 1) for t in state_tensors(working))
        return (len(tokens) - have) * per_token

    def make_room(self, needed: int, reserved: int = 0, newcomer: Newcomer | None = None) -> int:
        """Evict entries until bytes + reserved + needed fit the budget (or nothing may go); bytes freed.

        Which entry goes is the main-conversation rule's choice (retention.py); `newcomer`: the entry the room
        is for, which may not take a namespace's main conversation unless it is one itself."""
        freed = 0
        while self.bytes + reserved + needed > self.budget_bytes:
            candidates = [e for e in self.entries.values() if e.node.locks == 0]
            eviction = next_eviction(candidates, self.entries.values(), self._clock(), newcomer)
            if eviction.spared is not None and self._on_spared is not None:
                self._on_spared(eviction)
            if eviction.victim is None:
                break
            freed += self.drop(eviction.victim.id)
        return freed

    def drop(self, entry_id: str) -> int:
        entry = self.entries.pop(entry_id)
        if self._hints.get((entry.namespace, entry.hint_key or "")) == entry_id:
            del self._hints[(entry.namespace, entry.hint_key or "")]
        entry.node.entries.discard(entry_id)
        tree = self.trees[entry.namespace]
        freed = tree.collect(entry.node) if entry.node.parent is not None else 0
        if not tree.root.children:
            del self.trees[entry.namespace]
        return freed

    def prune(self, *, older_than_s: float | None = None, namespace: str | None = None) -> int:
        """Drop entries (of `namespace`, if given) created more than `older_than_s` ago; bytes freed."""
        cutoff = time.time() - older_than_s if older_than_s is not None else None
        victims = [e.id for e in self.entries.values()
                   if (namespace is None or e.namespace == namespace) and (cutoff is None or e.created <= cutoff)]
        return sum(self.drop(entry_id) for entry_id in victims)

    def check_integrity(self) -> None:
        """Every invariant of the tier, checked from scratch (tests call it after every operation).

        Node links agree both ways; each node's start follows its parent; each node's KV covers exactly
        its span and is counted once from its storages; no node lives that nothing needs; each entry ends
        on a node of its namespace's tree; tracked bytes equal the bytes of all tensors held; the budget
        holds; conversations keep at most `rounds` rounds.
        """
        for namespace, tree in self.trees.items():
            assert tree.root.children, f"empty tree kept for {namespace}"
            nodes = tree.nodes()
            for node in nodes:
                assert node.parent is not None and node.parent.children.get(node.tokens[0]) is node
                assert node.start == node.parent.end, "a node starts where its parent ends"
                assert node.kv is not None and all(t.shape[-2] == len(node.tokens) for t in state_tensors(node.kv))
                assert node.nbytes == storage_bytes(state_tensors(node.kv)), "node bytes are its storages"
                assert node.needed, "a node nothing needs was not freed"
                assert node.locks >= 0
                for entry_id in node.entries:
                    entry = self.entries[entry_id]
                    assert entry.node is node and entry.namespace == namespace
            held = [t for node in nodes for t in state_tensors(node.kv)]
            assert tree.bytes == sum(n.nbytes for n in nodes) == storage_bytes(held), "bytes == real bytes"
        for entry in self.entries.values():
            root = entry.node.path()[0].parent if entry.node.parent is not None else None
            assert root is not None and root is self.trees[entry.namespace].root, "entry is attached"
            assert entry.id in entry.node.entries
        for (namespace, _), entry_id in self._hints.items():
            assert self.entries[entry_id].namespace == namespace
        newest: dict[str, int] = {}
        for entry in self.entries.values():
            newest[entry.conversation] = max(newest.get(entry.conversation, 0), entry.round)
        assert all(e.round > newest[e.conversation] - self.rounds for e in self.entries.values()), "rounds bound"

    # ------------------------------------------------------------------ internals

    def _hinted_entry(self, namespace: str, hint: str | None) -> Entry | None:
        if not hint:
            return None
        entry = self.entries.get(hint) or self.entries.get(self._hints.get((namespace, hint), ""))
        return entry if entry is not None and entry.namespace == namespace else None

    def _best_candidate(self, tree: RadixTree, match: Match) -> Candidate | None:
        """The entry sharing the largest fraction of itself with the matched path, ties to the longer match."""
        best: Candidate | None = None
        for node, take in match.steps:
            matched = node.start + take
            for entry_id in node.entries if take == len(node.tokens) else ():
                best = _better(best, Candidate(self.entries[entry_id], matched))
        last = match.last_node
        if last is not None:
            matched = match.length
            for node in [last, *_descendants(last)]:
                for entry_id in node.entries:
                    if self.entries[entry_id].length > matched:
                        best = _better(best, Candidate(self.entries[entry_id], matched))
        return best

    def _drop_old_rounds(self, newest: Entry) -> None:
        oldest_kept = newest.round - self.rounds + 1
        stale = [e.id for e in self.entries.values()
                 if e.conversation == newest.conversation and e.round < oldest_kept]
        for entry_id in stale:
            self.drop(entry_id)

    def _lru_entry(self, exclude: Entry | None = None) -> Entry | None:
        """The least recently used entry whose path no running request holds (locked nodes cannot go)."""
        candidates = [e for e in self.entries.values() if e is not exclude and e.node.locks == 0]
        return min(candidates, key=lambda e: e.last_used, default=None)


def _better(best: Candidate | None, other: Candidate) -> Candidate:
    if best is None or (other.fraction, other.matched) > (best.fraction, best.matched):
        return other
    return best


def _ends_on(match: Match, node: Node) -> bool:
    return any(n is node and take == len(n.tokens) for n, take in match.steps)


def _descendants(node: Node) -> list[Node]:
    out, stack = [], list(node.children.values())
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(child.children.values())
    return out
