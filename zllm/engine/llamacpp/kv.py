"""`LlamaKV`: llama.cpp's side of the prefix cache (kvcache/kv_interface.py) — the engine's own sequences.

A running sequence is an engine sequence; a kept handle is the same sequence, taken over when its request finished
(no copy); sharing a kept prefix is `engine.share` (seq_cp: the new sequence shares the cells). Room is counted in
the pool's cells and answered in bytes (`bytes_per_token` each). The SSD tier (kvcache/snapshot_store.py) stores
the sequence's exported state, loaded whole.

Kept handles dropped off the engine thread (a prune) give their cells back at the engine thread's next call:
llama.cpp's memory is engine-thread only.
"""

from __future__ import annotations

import threading
from typing import Any

from zllm.kvcache.ssd_index import SnapshotInvalid


class LlamaKV:
    shares_prefixes = False  # each kept sequence holds its own cells (a prefix entry is superseded)
    token_bytes = 0  # an exported state is loaded whole

    def __init__(self, engine, *, layout: str, spare_sequences: int):
        """`layout` names what makes a saved state loadable (model, backend, KV types); `spare_sequences` are kept
        free for rows about to start (the batch size plus one)."""
        self.engine = engine
        self.bytes_per_token = engine.bytes_per_token
        self.snapshot_layout = layout
        self.spare_sequences = spare_sequences
        self._reserved: dict[int, int] = {}  # running sequence id → tokens of room it reserves
        self._kept: dict[int, int] = {}  # kept sequence id → its tokens
        self._doomed: list[Any] = []  # kept sequences dropped off the engine thread, to give back on it
        self._engine_thread: int | None = None

    # ------------------------------------------------------------------ running sequences (engine thread)

    def room_bytes(self, tokens: int) -> int:
        return tokens * self.bytes_per_token

    def bytes_to_open(self, tokens: int) -> int:
        return tokens * self.bytes_per_token

    def open(self, tokens: int) -> Any:
        self._on_engine_thread()
        seq = self.engine.open()
        self._reserved[seq.seq_id] = tokens
        return seq

    def share(self, kept: Any, length: int, tokens: int) -> Any:
        self._on_engine_thread()
        seq = self.engine.share(kept, length)
        self._reserved[seq.seq_id] = tokens
        return seq

    def release(self, running: Any, buffers: Any = None, *, kept: bool = False) -> None:
        self._on_engine_thread()
        self._reserved.pop(running.seq_id, None)
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
        self._kept[state.seq_id] = len(tokens)
        return state

    def drop(self, kept: Any) -> None:
        self._kept.pop(kept.seq_id, None)
        if self._engine_thread in (None, threading.get_ident()):
            self.engine.release(kept)
        else:
            self._doomed.append(kept)

    def close(self) -> None:
        """After the engine thread stopped: give back what a prune dropped."""
        self._engine_thread = None
        self._give_back_doomed()

    def length(self, kept: Any) -> int:
        return self.engine.length(kept)

    def held_bytes(self) -> int:
        return sum(self._kept.values()) * self.bytes_per_token

    def exclusive_bytes(self, kept: Any) -> int:
        return self._kept.get(kept.seq_id, 0) * self.bytes_per_token

    def pool_bytes(self) -> int:
        return sum(self._reserved.values()) * self.bytes_per_token

    def reserved_bytes(self) -> int:
        return self.pool_bytes()

    def check(self, kept: Any, length: int) -> None:
        assert self.engine.length(kept) == length == self._kept[kept.seq_id], f"sequence {kept.seq_id} lost cells"
        assert all(n >= 0 for n in self._reserved.values()), "reservations never go negative"

    # ------------------------------------------------------------------ the SSD tier: exported sequence states

    def export(self, kept: Any, state: Any, length: int):
        """The sequence's state, copied out of the pool now (the writer never touches llama.cpp)."""
        exported = self.engine.export_state(state)
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
        self.engine.release(running)
        return seq

    # ------------------------------------------------------------------ internals

    def _on_engine_thread(self) -> None:
        self._engine_thread = threading.get_ident()
        self._give_back_doomed()

    def _give_back_doomed(self) -> None:
        while self._doomed:
            self.engine.release(self._doomed.pop())
