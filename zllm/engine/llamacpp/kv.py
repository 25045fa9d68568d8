"""`LlamaKV`: llama.cpp's side of the prefix cache (kvcache/kv_interface.py) — the engine's own sequences.

A running sequence is an engine sequence; a kept handle is the same sequence, taken over when its request finished
(no copy); sharing a kept prefix is `engine.share` (seq_cp: the new sequence shares the cells). Room is counted in
the pool's cells and answered in bytes (`bytes_per_token` each). The SSD tier (kvcache/snapshot_store.py) stores
the sequence's exported state, loaded whole.

Kept handles dropped off the engine thread (a prune) give their cells back at the engine thread's next call:
llama.cpp's memory is engine-thread only.

Parking (llama-server's `--cache-ram`): llama.cpp attends over every cell up to the pool's highest used one and
masks other sequences' cells, so a new prompt beside 32K kept cells prefills ~5x slower than in an empty pool
(bench/kept_sequences.py). When a request is admitted, every kept sequence that no running request shares and
that it does not share from is parked: its state exported into host RAM (`park_budget_bytes` in all) and its cells
freed; a request that hits it imports it back first. A parked handle still counts in `held_bytes` (the device
budget), so there is always room to bring it back. bench/parked_sequences.py measures both sides.

Exporting a long sequence is a copy into fresh host memory (~0.1 s of CPU per 4K tokens of the default model, most
of it page faults), and a kept conversation is exported twice in a row otherwise: for its SSD snapshot when its turn
ends, and for parking when the next request (a side request) is admitted. So the snapshot's export stays with the
kept handle (`copy`, within the same RAM budget) and parking it takes that copy instead of exporting again; a
sequence brought back from RAM keeps its parked bytes as its copy the same way.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from zllm.engine.llamacpp.backend import LlamaSequence
from zllm.kvcache.ssd_index import SnapshotInvalid


# a request sharing a prefix that leaves this many of the kept sequence's cells behind parks it (LlamaKV.share); a
# continuing turn shares all or nearly all of its conversation and keeps it in the pool
PARK_REST_CELLS = 256


@dataclass(eq=False)
class KeptSequence:
    """A kept handle: its tokens in the pool (`seq`) or, parked, in host RAM (`parked`: the exported state). In
    the pool it may also hold `copy`: an export of those same cells (kept sequences never change), parked for free."""

    seq: LlamaSequence | None
    length: int
    parked: memoryview | None = None
    copy: memoryview | None = None


class LlamaKV:
    shares_prefixes = False  # each kept sequence holds its own cells (a prefix entry is superseded)
    token_bytes = 0  # an exported state is loaded whole

    def __init__(self, engine, *, layout: str, spare_sequences: int, park_budget_bytes: int = 0):
        """`layout` names what makes a saved state loadable (model, backend, KV types); `spare_sequences` are kept
        free for rows about to start (the batch size plus one); `park_budget_bytes`: host RAM for parked kept
        sequences (0 = none parked: they stay in the pool)."""
        self.engine = engine
        self.bytes_per_token = engine.bytes_per_token
        self.snapshot_layout = layout
        self.spare_sequences = spare_sequences
        self._reserved: dict[int, int] = {}  # running sequence id → tokens of room it reserves
        self._kept: dict[KeptSequence, int] = {}  # kept handle → its tokens
        self._sharing: dict[int, KeptSequence] = {}  # running sequence id → the kept handle it shares cells with
        self.park_budget_bytes = park_budget_bytes
        self.parked_bytes = 0
        self.copied_bytes = 0  # kept sequences' `copy` exports, held within the same RAM budget
        self.parks = self.unparks = 0
        self.park_exports = 0  # parks that had no copy at hand and exported the sequence
        self._doomed: list[Any] = []  # kept sequences dropped off the engine thread, to give back on it
        self._engine_thread: int | None = None

    # ------------------------------------------------------------------ running sequences (engine thread)

    def room_bytes(self, tokens: int) -> int:
        return tokens * self.bytes_per_token

    def bytes_to_open(self, tokens: int) -> int:
        return tokens * self.bytes_per_token

    def open(self, tokens: int) -> Any:
        self._on_engine_thread()
        self._park_idle(None)
        seq = self.engine.open()
        self._reserved[seq.seq_id] = tokens
        return seq

    def share(self, kept: Any, length: int, tokens: int) -> Any:
        """A running sequence holding `kept`'s first `length` tokens (seq_cp). When that is a short prefix of
        `kept` (its other cells are PARK_REST_CELLS or more) and nothing else running shares it, `kept` is parked
        right after: the cells past the prefix leave the pool instead of being attended, masked, by the request's
        whole prefill (a cold prompt sharing only the chat template's opening tokens, a side request sharing the
        system prompt of a long conversation: 1.3-1.5x the CPU of the same prefill in an empty pool)."""
        self._on_engine_thread()
        self._park_idle(kept)
        self._unpark(kept)
        seq = self.engine.share(kept.seq, length)
        self._reserved[seq.seq_id] = tokens
        shared = id(kept) in set(map(id, self._sharing.values()))
        if shared or kept.length - length < PARK_REST_CELLS or not self._park(kept):
            self._sharing[seq.seq_id] = kept
        elif self.engine.settings.exact:
            self.engine.pack()  # exact mode buried the parked cells: drop them, pack the live ones
        return seq

    def release(self, running: Any, buffers: Any = None, *, kept: bool = False) -> None:
        self._on_engine_thread()
        self._reserved.pop(running.seq_id, None)
        self._sharing.pop(running.seq_id, None)
        if not kept:
            self.engine.release(running)

    def end_reservation(self, running: Any) -> None:
        self._reserved.pop(running.seq_id, None)

    def short_of_sequences(self) -> bool:
        return self.engine.free_sequences + len(self._doomed) < self.spare_sequences

    # ------------------------------------------------------------------ kept handles

    def new_bytes(self, namespace: str, tokens: tuple[int, ...]) -> int:
        return len(tokens) * self.bytes_per_token

    def keep(self, namespace: str, tokens: tuple[int, ...], state: Any, running: Any, entry_id: str) -> Any:
        """`state` is the request's engine sequence, holding exactly `tokens`: it becomes the kept handle."""
        self._reserved.pop(state.seq_id, None)
        self._sharing.pop(state.seq_id, None)
        handle = KeptSequence(state, len(tokens))
        self._kept[handle] = len(tokens)
        return handle

    def drop(self, kept: Any) -> None:
        self._kept.pop(kept, None)
        self._forget_copy(kept)
        if kept.parked is not None:
            self.parked_bytes -= len(kept.parked)
            kept.parked = None
        elif self._engine_thread in (None, threading.get_ident()):
            self.engine.release(kept.seq)
        else:
            self._doomed.append(kept.seq)

    def close(self) -> None:
        """After the engine thread stopped: give back what a prune dropped."""
        self._engine_thread = None
        self._give_back_doomed()

    def length(self, kept: Any) -> int:
        return kept.length

    def held_bytes(self) -> int:
        return sum(self._kept.values()) * self.bytes_per_token

    def exclusive_bytes(self, kept: Any) -> int:
        return self._kept.get(kept, 0) * self.bytes_per_token

    def pool_bytes(self) -> int:
        return sum(self._reserved.values()) * self.bytes_per_token

    def reserved_bytes(self) -> int:
        return self.pool_bytes()

    def check(self, kept: Any, length: int) -> None:
        held = self.engine.length(kept.seq) if kept.parked is None else kept.length
        assert held == length == kept.length == self._kept[kept], "a kept sequence lost cells"
        assert (kept.seq is None) == (kept.parked is not None), "a kept sequence is in the pool or parked, not both"
        assert all(n >= 0 for n in self._reserved.values()), "reservations never go negative"
        assert kept.copy is None or kept.parked is None, "a parked sequence's bytes are its parked state"
        assert self.parked_bytes == sum(len(k.parked) for k in self._kept if k.parked is not None), \
            "parked bytes are counted"
        assert self.copied_bytes == sum(len(k.copy) for k in self._kept if k.copy is not None), \
            "copies are counted"
        assert self.parked_bytes + self.copied_bytes <= max(self.park_budget_bytes, 0), \
            "parked sequences and copies stay within their RAM budget"

    # ------------------------------------------------------------------ the SSD tier: exported sequence states

    def export(self, kept: Any, state: Any, length: int):
        """The sequence's state, copied out of the pool now (the writer never touches llama.cpp); the kept handle
        holding `state` keeps the copy, so parking it later exports nothing (the module's docstring)."""
        exported = self.engine.export_state(state)
        if kept is not None and kept.seq is state:
            self._hold_copy(kept, exported)
        return lambda: exported

    def load(self, running: Any, payload: Any, first: int, length: int, stored: int) -> Any:
        """The whole saved state in a new sequence, cropped to `length`, in place of `running`."""
        self._on_engine_thread()
        try:
            seq = self.engine.import_state(payload, stored)
        except Exception as exc:  # state the engine refuses: set aside like a damaged blob
            raise SnapshotInvalid(f"llama.cpp refused the state: {exc}") from exc
        self.engine.crop(seq, length)
        self._reserved[seq.seq_id] = self._reserved.pop(running.seq_id, 0)
        self._sharing.pop(running.seq_id, None)  # the restored state replaces what `running` shared
        self.engine.release(running)
        return seq

    # ------------------------------------------------------------------ parking (the module's docstring)

    def _park_idle(self, sharing: KeptSequence | None) -> None:
        """Park every kept sequence in the pool that no running request shares, except `sharing` (the admitted
        request's source), while the RAM budget holds; then pack the pool so the running cells sit low."""
        if self.park_budget_bytes <= 0:
            return
        busy = set(map(id, self._sharing.values())) | {id(sharing)}
        parked = False
        for kept in list(self._kept):
            if kept.parked is None and id(kept) not in busy:
                parked = self._park(kept) or parked
        if parked and self.engine.settings.exact:
            self.engine.pack()  # exact mode keeps released cells as dead ones: drop them, pack the live ones

    def _park(self, kept: KeptSequence) -> bool:
        """`kept`'s state into host RAM (its `copy` when it has one, else exported now) and its cells freed, if
        the RAM budget holds it; else it stays in the pool (attended, masked) and this says False."""
        if self.park_budget_bytes <= 0:
            return False
        state = kept.copy
        self._forget_copy(kept)
        size = len(state) if state is not None else self.engine.state_size(kept.seq)
        if self.parked_bytes + self.copied_bytes + size > self.park_budget_bytes:
            return False
        # a writable buffer of its own: imported without a copy
        if state is None:
            state = self.engine.export_state(kept.seq)
            self.park_exports += 1
        kept.parked = state
        self.engine.release(kept.seq)
        kept.seq = None
        self.parked_bytes += len(kept.parked)
        self.parks += 1
        return True

    def _unpark(self, kept: KeptSequence) -> None:
        if kept.parked is None:
            return
        kept.seq = self.engine.import_state(kept.parked, kept.length)
        self.parked_bytes -= len(kept.parked)
        kept.parked, state = None, kept.parked
        self.unparks += 1
        self._hold_copy(kept, state)  # the same bytes as the cells just filled: the next park is free

    def _hold_copy(self, kept: KeptSequence, state: memoryview) -> None:
        """`state` (an export of `kept`'s cells) stays with it while the RAM budget holds it too."""
        self._forget_copy(kept)
        if self.parked_bytes + self.copied_bytes + len(state) <= self.park_budget_bytes:
            kept.copy = state
            self.copied_bytes += len(state)

    def _forget_copy(self, kept: KeptSequence) -> None:
        if kept.copy is not None:
            self.copied_bytes -= len(kept.copy)
            kept.copy = None

    # ------------------------------------------------------------------ internals

    def _on_engine_thread(self) -> None:
        self._engine_thread = threading.get_ident()
        self._give_back_doomed()

    def _give_back_doomed(self) -> None:
        while self._doomed:
            self.engine.release(self._doomed.pop())
