"""`Backing`: a working set (pool.py's `[1, kv_heads, capacity, head_dim]` per tensor) that the span tree keeps
instead of cloning out of it, so the next turn of its conversation runs in it without copying the prefix.

    buffer   [ sys prompt + tools | turn 1 | turn 2 ···· | room ········ ]
    viewers    node A [0, 12000)   node B    node C        ← tree nodes whose KV is a view at their own positions
    frontier                                          ^ (the largest viewer end): below it the bytes are kept KV

Invariant: for every viewer V, the buffer's tokens [0, V.end) are V's path's KV. So the viewers lie on one chain
(a buffer holds one sequence), and a request continuing that chain may *adopt* the buffer — append past the frontier
in place, as it would in a pooled set — provided nobody else writes it (`running`) or still reads past where it
starts writing (`readers`: SSD exports in flight, tracked by weak references to their callables).

The bytes count whole (a view pins its storage), once, wherever the backing is counted (kv.py).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zllm.engine.torch.cache.state import KVState, buffers_key, state_tensors, storage_bytes

if TYPE_CHECKING:
    from zllm.engine.torch.cache.radix import Node


_READER_IDS = itertools.count()


def capacity(state: KVState) -> int:
    return state[0][0].shape[-2]


@dataclass(eq=False)
class Backing:
    buffers: KVState = field(repr=False)  # the whole working set, full capacity
    viewers: set[Node] = field(default_factory=set, repr=False)  # nodes whose KV is a view of it at their own positions
    running: bool = False  # a running request adopted it: it appends past the frontier
    nbytes: int = 0
    # SSD exports in flight (the writer thread reads them): id → tokens read; each leaves when its callable is freed
    _readers: dict[int, int] = field(default_factory=dict, repr=False)
    _readers_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.nbytes = storage_bytes(state_tensors(self.buffers))

    @property
    def key(self) -> int:
        return buffers_key(self.buffers)

    @property
    def capacity(self) -> int:
        return capacity(self.buffers)

    def add_reader(self, export: object, tokens: int) -> None:
        """`export` reads the first `tokens` tokens until it is garbage (the writer lets go of a job once written)."""
        reader = next(_READER_IDS)
        with self._readers_lock:
            self._readers[reader] = tokens
        weakref.finalize(export, self._forget_reader, reader)

    def read_until(self) -> int:
        """How far exports still in flight read it (they hold views; a writer past this point would race them)."""
        with self._readers_lock:
            return max(self._readers.values(), default=0)

    def _forget_reader(self, reader: int) -> None:
        with self._readers_lock:
            self._readers.pop(reader, None)

    def tokens_past(self, length: int) -> int:
        """Tokens its viewers hold past `length`: what adopting it at `length` must clone out first."""
        return sum(v.end - max(v.start, length) for v in self.viewers if v.end > length)

    def viewed_tokens(self) -> int:
        return sum(len(v.tokens) for v in self.viewers)
