"""`TorchKV`: the torch backend's side of the prefix cache (kvcache/kv_interface.py).

A running sequence is a working set of buffers (`[1, kv_heads, capacity, head_dim]` per tensor): one taken from the
pool (pool.py), or a kept one it *adopted*; a kept handle is a node of a per-namespace span tree (radix.py: entries
sharing a prefix share its nodes). A node's KV is an owned clone or a view of a kept working set (backing.py).

    turn 1 (cold)   pool set P ← prefill, decode        keep: P itself is kept (views), not cloned out
    turn 2 (hit)    adopts P, appends past its frontier  keep: the new span is a view of P too     (no copy at all)
    a fork / P busy / P mostly empty                     copy the kept spans into a pool set, as a cache miss would
                                                         have computed them (one memory copy per span)

A working set is kept whole when it is at least half full (its bytes count whole: a view pins its storage), else
the new span is cloned and the set goes back to the pool. A request that outgrew its set keeps what it grew into,
and the chain's older views move there (`_gather`), so a conversation ends up in one working set, grown like a
vector: a copy per doubling, not per turn. The SSD tier (kvcache/snapshot_store.py) stores a sequence token-major,
so a restore reads only the token range it lacks; an export in flight reads views, so no one writes where it reads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import partial

import torch

from zllm.engine.torch.cache.backing import Backing, capacity
from zllm.engine.torch.cache.pool import BufferPool
from zllm.engine.torch.cache.radix import Node, RadixTree
from zllm.engine.torch.cache.state import (
    KVLayout,
    KVState,
    buffers_key,
    clone_state,
    copy_into,
    slice_state,
    state_tensors,
    storage_bytes,
    whole_buffers,
)

# a kept backing whose viewers use less than this share of it is cloned out and freed when an entry goes
MIN_BACKING_USE = 0.25


@dataclass(eq=False)
class Span:
    """A kept handle: the span-tree node an entry's sequence ends at."""

    namespace: str
    node: Node
    entry_id: str


class TorchKV:
    shares_prefixes = True

    def __init__(self, layout: KVLayout, device: torch.device | str, *, keep_working_sets: bool = True):
        """`keep_working_sets` False: every kept span is cloned and every hit copies (the behaviour before working
        sets were kept; bench/torch_hit_copy.py measures one against the other)."""
        self.layout = layout
        self.keep_working_sets = keep_working_sets
        self.bytes_per_token = self.token_bytes = layout.bytes_per_token
        self.snapshot_layout = layout.key
        self.pool = BufferPool(layout, device)
        self.trees: dict[str, RadixTree] = {}
        self.backings: dict[int, Backing] = {}  # by buffers_key: kept working sets (viewed, or adopted, or both)
        self.adoptions = 0  # hits that ran in the kept working set (no copy)
        # the cache's lock guards every call but `load` (an SSD restore, outside it) and `drop` (prune, any thread)
        self._lock = threading.RLock()

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
        """A working set holding the kept path's first `length` tokens: the kept working set they are views of,
        adopted (the request appends past `length` in place), or a pool set they are copied into."""
        with self._lock:
            backing = self._adoptable(kept, length)
            if backing is not None:
                self._adopt(self.trees[kept.namespace], backing, length)
                return backing.buffers
        working = self.pool.take(tokens)
        for node in kept.node.path():
            if node.start >= length:
                break
            copy_into(working, node.start, slice_state(node.kv, 0, min(len(node.tokens), length - node.start)))
        return working

    def release(self, running: KVState, buffers: KVState | None = None, *, kept: bool = False) -> None:
        """`running` goes back where it came from: the pool, or (adopted) the tree; a set `keep` kept stays kept."""
        final = buffers if buffers is not None else running
        with self._lock:
            adopted = self.backings.get(buffers_key(running))
            kept_final = buffers_key(final) in self.backings
            if adopted is not None and adopted.running:
                adopted.running = False
                self._settle(adopted)
                if not kept_final:
                    self.pool.offer(final)  # outgrown and not kept: the next request may use it
            elif kept_final:
                self.pool.hand_over(running, final)
            else:
                self.pool.give_back(running, buffers)

    def end_reservation(self, running: KVState) -> None:
        """Working sets count until they are given back."""

    @staticmethod
    def short_of_sequences() -> bool:
        return False

    # ------------------------------------------------------------------ kept handles

    def new_bytes(self, namespace: str, tokens: tuple[int, ...]) -> int:
        """Bytes a keep of `tokens` would add at most (the span past the existing path, cloned; keeping the
        working set itself adds none: its bytes were the running request's)."""
        tree = self.trees.get(namespace)
        have = tree.match(tokens).length if tree else 0
        return (len(tokens) - have) * self.bytes_per_token

    def keep(self, namespace: str, tokens: tuple[int, ...], state: KVState, running: KVState, entry_id: str) -> Span:
        with self._lock:
            tree = self.trees.setdefault(namespace, RadixTree())
            backing = self._backing_to_keep(tokens, state, running)
            node, _ = tree.insert(tokens, state, backing)
            if backing is not None:
                self._gather(tree, node, backing, buffers_key(running))
                self._settle(backing)  # the sequence was all there, on other sets: this one is not needed
            node.entries.add(entry_id)
            return Span(namespace, node, entry_id)

    def drop(self, kept: Span) -> None:
        with self._lock:
            kept.node.entries.discard(kept.entry_id)
            tree = self.trees.get(kept.namespace)
            if tree is None or kept.node.parent is None:
                return
            for backing in {node.backing for node in tree.collect(kept.node) if node.backing is not None}:
                if not backing.running and backing.viewed_tokens() < MIN_BACKING_USE * backing.capacity:
                    for viewer in list(backing.viewers):  # a few tokens must not pin a whole working set
                        tree.own(viewer)
                self._settle(backing)
            if not tree.root.children:
                del self.trees[kept.namespace]

    def close(self) -> None:
        """Nothing deferred."""

    @staticmethod
    def length(kept: Span) -> int:
        return kept.node.end

    def held_bytes(self) -> int:
        with self._lock:
            return sum(tree.bytes for tree in self.trees.values()) + \
                sum(b.nbytes for b in self.backings.values() if b.viewers)

    def exclusive_bytes(self, kept: Span) -> int:
        """Bytes freed if only this handle went: the tail of its path that nothing else needs (owned spans, and
        working sets only that tail views)."""
        node = kept.node
        if node.children or len(node.entries) > 1:
            return 0
        freed = [node]
        current = node.parent
        while current is not None and not current.is_root and len(current.children) == 1 and not current.entries:
            freed.append(current)
            current = current.parent
        with self._lock:
            backings = {n.backing for n in freed if n.backing is not None}
            return sum(n.nbytes for n in freed) + sum(b.nbytes for b in backings
                                                      if not b.running and b.viewers <= set(freed))

    def pool_bytes(self) -> int:
        """The pool's sets, and adopted sets no entry views any more (their entries were evicted mid-request)."""
        with self._lock:
            return self.pool.bytes + sum(b.nbytes for b in self.backings.values() if b.running and not b.viewers)

    def reserved_bytes(self) -> int:
        with self._lock:
            return self.pool.in_use_bytes() + sum(b.nbytes for b in self.backings.values() if b.running)

    def check(self, kept: Span, length: int) -> None:
        """The handle's node ends at `length` in a live tree; every view is its backing's span at its own
        positions; held bytes are the real bytes of every tensor the trees hold, each storage once."""
        tree = self.trees[kept.namespace]
        assert kept.node.end == length and kept.entry_id in kept.node.entries
        assert kept.node.path()[0].parent is tree.root, "the span is attached"
        nodes = [n for t in self.trees.values() for n in t.nodes()]
        for node in tree.nodes():
            assert node.parent.children.get(node.tokens[0]) is node and node.start == node.parent.end
            assert all(t.shape[-2] == len(node.tokens) for t in state_tensors(node.kv)), "a node covers its span"
            assert node.needed, "a node nothing needs was not freed"
            if node.backing is not None:
                assert node in node.backing.viewers and self.backings[node.backing.key] is node.backing
                view, whole = state_tensors(node.kv)[0], state_tensors(node.backing.buffers)[0]
                assert view.data_ptr() == whole[..., node.start:, :].data_ptr(), "a view sits at its own positions"
        for backing in self.backings.values():
            assert backing.viewers or backing.running, "a backing nothing views or runs in was not let go"
            assert all(v.parent is not None for v in backing.viewers), "a freed node still views a backing"
        assert tree.bytes == storage_bytes(t for n in tree.nodes() if n.backing is None for t in state_tensors(n.kv))
        assert self.held_bytes() == storage_bytes(t for n in nodes for t in state_tensors(n.kv)), "bytes == real"

    # ------------------------------------------------------------------ adopting and keeping working sets

    def _adoptable(self, kept: Span, length: int) -> Backing | None:
        """The kept working set holding the path's first `length` tokens, when a request may append past them in
        place: no one else runs in it, no export reads past `length`, and what its viewers hold past `length`
        (cloned out first) is less than the copy it saves."""
        node = next(n for n in reversed(kept.node.path()) if n.start < length)  # the node holding token length-1
        backing = node.backing
        if backing is None or backing.running or backing.read_until() > length:
            return None
        return backing if backing.tokens_past(length) < length else None

    def _adopt(self, tree: RadixTree, backing: Backing, length: int) -> None:
        for viewer in sorted((v for v in backing.viewers if v.end > length), key=lambda v: v.start):
            if viewer.start < length:
                tree.split(viewer, length - viewer.start)  # the upper part stays a view; the lower is `viewer`
            tree.own(viewer)
        backing.running = True
        self.adoptions += 1

    def _backing_to_keep(self, tokens: tuple[int, ...], state: KVState, running: KVState | None) -> Backing | None:
        """The working set a finished request's new span is kept as a view of: the one it adopted, or the set it
        ran in (or grew into) when at least half of it is the kept sequence. None: clone the span (a short
        sequence in a large set, or a state that is no running request's)."""
        if running is None or not self.keep_working_sets:
            return None
        adopted = self.backings.get(buffers_key(running))
        if adopted is not None and adopted.running and buffers_key(state) == adopted.key:
            return adopted
        buffers = running if buffers_key(state) == buffers_key(running) else whole_buffers(state, self.layout)
        if 2 * len(tokens) < capacity(buffers):
            return None
        return self.backings.setdefault(buffers_key(buffers), Backing(buffers))

    def _gather(self, tree: RadixTree, node: Node, backing: Backing, running: int) -> None:
        """Point the kept path at `backing` (it holds the whole sequence) wherever that frees something: owned
        spans, and other working sets only this path views (the one the request adopted and outgrew, `running`,
        too). The chain then lives in one set, adoptable whole."""
        path = node.path()
        on_path = set(path)
        for step in path:
            other = step.backing
            if other is backing:
                continue
            if other is None:
                tree.view(step, backing)
            elif (not other.running or other.key == running) and other.viewers <= on_path:
                for viewer in list(other.viewers):
                    tree.view(viewer, backing)
                self._settle(other)

    def _settle(self, backing: Backing) -> None:
        """Let go of a backing nothing views and no request runs in (pending exports keep their own views)."""
        if not backing.viewers and not backing.running:
            self.backings.pop(backing.key, None)

    # ------------------------------------------------------------------ the SSD tier: token-major bytes

    def export(self, kept: Span | None, state: KVState, length: int):
        """The writer gets the tree's spans (never written once kept: no copy here; a kept working set is not
        adopted past what an export in flight reads) or its own copy of the working buffers (reused by the next
        request); it serialises them on its thread."""
        if kept is None:
            return partial(token_major_bytes, (clone_state(slice_state(state, 0, length)),), length)
        path = kept.node.path()
        export = partial(token_major_bytes, tuple(node.kv for node in path), length)
        for backing in {node.backing for node in path if node.backing is not None}:
            backing.add_reader(export, length)
        return export

    def load(self, running: KVState, payload, first: int, length: int, stored: int) -> KVState:
        """Tokens [first, length) into the running buffers. Under inference mode: the working buffers were
        made under it, and only inference mode may update them in place. An adopted set too small for the
        restored prefix is left for a pool set (its [0, first) copied)."""
        if capacity(running) < length:
            running = self._move_to_pool(running, first, length)
        rows = torch.frombuffer(payload, dtype=torch.uint8).view(length - first, self.bytes_per_token)
        column = 0
        with torch.inference_mode():
            for layer, specs in zip(running, self.layout.layers):
                for target, spec in zip(layer, specs):
                    tensor = rows[:, column:column + spec.row_bytes].contiguous().view(spec.dtype)
                    target[..., first:length, :].copy_(tensor.view(length - first, *spec.row_shape).movedim(0, -2))
                    column += spec.row_bytes
        return running

    def _move_to_pool(self, running: KVState, held: int, length: int) -> KVState:
        working = self.pool.take(length)
        with torch.inference_mode():
            copy_into(working, 0, slice_state(running, 0, held))
        self.release(running)
        return working


def token_major_bytes(sources: tuple[KVState, ...], length: int) -> memoryview:
    """The first `length` tokens of the concatenated spans as one token-major payload: token t's row of every
    layer's k and v, back to back (what `load` reads, kvcache/snapshot_frame.py's `token_bytes`)."""
    columns = []
    for layer in range(len(sources[0])):
        for i in range(len(sources[0][layer])):
            tensor = torch.cat([span[layer][i].cpu() for span in sources], dim=-2)[..., :length, :]
            columns.append(tensor.movedim(-2, 0).contiguous().view(length, -1).view(torch.uint8))
    return memoryview(torch.cat(columns, dim=1).numpy()).cast("B")
