"""Pooled buffers: the running request's working KV buffers and the SSD read staging buffer.

A working set is one preallocated buffer per KV tensor with room for `capacity` tokens
(`[1, kv_heads, capacity, head_dim]`): a restore writes the cached prefix into it, prefill and decode then
append in place (no per-token reallocation), and at the end the set comes back here for the next request — unless
the prefix cache keeps it whole for the next turn to run in (backing.py).
Reusing it avoids allocating (and page-faulting) hundreds of MB per request; the pool's bytes are part of
the device budget (the tier evicts to make room for them), so growth is never silent.

Staging is one flat uint8 buffer SSD reads land in before being copied into a working set (pinned host
memory when the working set lives on a GPU, so the copy can use DMA).
"""

from __future__ import annotations

import threading

import torch

from zllm.engine.torch.cache.state import KVLayout, KVState, buffers_key, state_tensors, storage_bytes

# capacities are rounded up so that slightly longer requests reuse the same buffers
CAPACITY_QUANTUM = 1024


def round_capacity(tokens: int) -> int:
    return max(CAPACITY_QUANTUM, -(-tokens // CAPACITY_QUANTUM) * CAPACITY_QUANTUM)


class BufferPool:
    """Holds at most one idle working set and one staging buffer. Thread-safe (stats are read elsewhere)."""

    def __init__(self, layout: KVLayout, device: torch.device | str):
        self.layout = layout
        self.device = torch.device(device)
        self._idle: KVState | None = None
        self._in_use: list[KVState] = []
        self._staging: torch.Tensor | None = None
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        with self._lock:
            sets = [*self._in_use, *([self._idle] if self._idle is not None else [])]
            staging = self._staging.nbytes if self._staging is not None else 0
        return storage_bytes(t for s in sets for t in state_tensors(s)) + staging

    def bytes_for(self, capacity: int) -> int:
        """Bytes a working set of `capacity` tokens takes."""
        return round_capacity(capacity) * self.layout.bytes_per_token

    def in_use_bytes(self) -> int:
        """Bytes of working sets taken and not yet given back: zero whenever no request holds a lease, so a
        nonzero value with nothing running is a leak (load tests check it after disconnects)."""
        with self._lock:
            taken = list(self._in_use)
        return storage_bytes(t for s in taken for t in state_tensors(s))

    def idle_bytes(self) -> int:
        with self._lock:
            idle = self._idle
        return storage_bytes(state_tensors(idle)) if idle is not None else 0

    def take(self, capacity: int) -> KVState:
        """A working set with room for at least `capacity` tokens (the idle one when large enough)."""
        with self._lock:
            idle, self._idle = self._idle, None
        if idle is None or _capacity(idle) < capacity:
            idle = None  # drop the small set before allocating the large one
            idle = self.layout.empty(round_capacity(capacity), self.device)
        with self._lock:
            self._in_use.append(idle)
        return idle

    def give_back(self, taken: KVState, current: KVState | None = None) -> None:
        """Return a set from `take`. `current` is what the request ended up using if it outgrew `taken`
        (the larger one is kept: the next request of that conversation will need it)."""
        with self._lock:
            self._in_use = [s for s in self._in_use if s is not taken]
            keep = current if current is not None and _capacity(current) > _capacity(taken) else taken
            if self._idle is None or _capacity(keep) >= _capacity(self._idle):
                self._idle = keep

    def hand_over(self, taken: KVState, kept: KVState) -> None:
        """The prefix cache keeps `kept` (what `taken` became, or a set it grew into): it is no longer the pool's;
        `taken`, if the request outgrew it, may still serve as the idle set."""
        with self._lock:
            self._in_use = [s for s in self._in_use if s is not taken]
        if buffers_key(kept) != buffers_key(taken):
            self.offer(taken)

    def offer(self, working: KVState) -> None:
        """A set no one holds any more: the idle set if it is larger than the current one."""
        with self._lock:
            if self._idle is None or _capacity(working) > _capacity(self._idle):
                self._idle = working

    def discard_idle(self) -> int:
        """Free the idle set (the tier needs its bytes); returns bytes freed."""
        with self._lock:
            idle, self._idle = self._idle, None
        return storage_bytes(state_tensors(idle)) if idle is not None else 0

    def staging(self, nbytes: int) -> torch.Tensor:
        """A flat uint8 buffer of at least `nbytes` (reused; grown by doubling)."""
        with self._lock:
            if self._staging is None or self._staging.numel() < nbytes:
                size = max(nbytes, 2 * (self._staging.numel() if self._staging is not None else 0))
                pin = self.device.type == "cuda"
                self._staging = None
                self._staging = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
            return self._staging


def _capacity(working: KVState) -> int:
    return working[0][0].shape[-2]
