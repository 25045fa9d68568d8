"""`KVSequences`: what the one prefix cache (prefix_cache.py) asks of a backend's KV. Each backend implements it in
its own package (engine/torch/cache/kv.py: pooled working buffers over a span tree of tensors; engine/llamacpp/kv.py:
the engine's sequences, shared by seq_cp); the cache holds the policy (entries, the shared-prefix graph, eviction,
near misses, the SSD tier's use), the backend only the cells.

Two kinds of handle, both opaque to the cache:
- a *running* sequence: what a lease carries (`Lease.kv`) and the engine's `open(lease)` reads; room for N tokens;
- a *kept* handle: a finished request's KV turned into an entry (`keep`), shared from (`share`) until `drop`.

The unit of room is bytes: a backend that counts cells converts at `bytes_per_token`.
"""

from __future__ import annotations

from typing import Any, Protocol


class KVSequences(Protocol):
    bytes_per_token: int
    # whether kept handles share the storage of a common prefix (torch's span tree): if not, an entry whose tokens are
    # a prefix of a newer one is dropped when the newer one is kept (the newer handle holds those cells too)
    shares_prefixes: bool

    # ------------------------------------------------------------------ running sequences (engine thread)

    def room_bytes(self, tokens: int) -> int:
        """Bytes a running sequence with room for `tokens` holds (the scheduler's unit)."""
        ...

    def bytes_to_open(self, tokens: int) -> int:
        """Bytes an `open`/`share` with room for `tokens` will add to `pool_bytes` (0 when an idle buffer fits)."""
        ...

    def open(self, tokens: int) -> Any:
        """An empty running sequence with room for `tokens`."""
        ...

    def share(self, kept: Any, length: int, tokens: int) -> Any:
        """A running sequence with room for `tokens` holding the first `length` tokens of a kept handle."""
        ...

    def release(self, running: Any, buffers: Any = None, *, kept: bool = False) -> None:
        """Give a running sequence back; `kept`: `keep` took it over as an entry. `buffers`: what the request ended
        with, when it outgrew the sequence's room."""
        ...

    def end_reservation(self, running: Any) -> None:
        """The running sequence stops counting as a running row's reservation (it is finishing)."""
        ...

    def short_of_sequences(self) -> bool:
        """Whether kept handles must go so that a row about to start finds a sequence (llama.cpp's ids)."""
        ...

    # ------------------------------------------------------------------ kept handles

    def new_bytes(self, namespace: str, tokens: tuple[int, ...]) -> int:
        """Bytes keeping `tokens` would add."""
        ...

    def keep(self, namespace: str, tokens: tuple[int, ...], state: Any, running: Any, entry_id: str) -> Any:
        """A finished request's KV (`state`, holding `tokens`; `running`: its sequence) as a kept handle."""
        ...

    def drop(self, kept: Any) -> None:
        """Free a kept handle (prune may call this from any thread: a backend defers what must run on the engine's)."""
        ...

    def close(self) -> None:
        """After the engine thread stopped: give back whatever a drop off the engine thread deferred."""
        ...

    def length(self, kept: Any) -> int: ...

    def held_bytes(self) -> int:
        """Bytes all kept handles hold (each shared span once)."""
        ...

    def exclusive_bytes(self, kept: Any) -> int:
        """Bytes freed if only this handle went."""
        ...

    def pool_bytes(self) -> int:
        """Bytes held for running sequences (and any idle buffer kept for the next), against the same budget."""
        ...

    def reserved_bytes(self) -> int:
        """Bytes running rows hold now (zero whenever no request runs: a nonzero value then is a leak)."""
        ...

    # ------------------------------------------------------------------ the SSD tier

    def open_ssd_store(self, config: Any) -> Any:
        """The backend's SSD snapshot store for `config.ssd_dir` (raises IndexLocked when another process has it)."""
        ...

    def ssd_lookup(self, store: Any, namespace: str, prompt: tuple[int, ...], hint: str | None
                   ) -> tuple[Any, Any]:
        """(the snapshot sharing the longest prefix, the best diverging one): each with .row, .length, .hinted."""
        ...

    def ssd_cut(self, match: Any, length: int) -> Any:
        """`match` restoring only its first `length` tokens."""
        ...

    def restore_bytes(self, match: Any, skip: int) -> int:
        """Bytes a restore of `match` reads when the first `skip` tokens are there already."""
        ...

    def ssd_read(self, store: Any, running: Any, match: Any, skip: int) -> Any:
        """Any thread: read the snapshot (torch: straight into the running sequence's buffers). Raises
        SnapshotInvalid, the snapshot quarantined, when it is damaged."""
        ...

    def ssd_load(self, store: Any, running: Any, match: Any, read: Any) -> tuple[Any, int]:
        """Engine thread: (the running sequence now holding the match's tokens, bytes read). Raises SnapshotInvalid
        (after quarantining) when the engine refuses the state."""
        ...

    def snapshot_job(self, *, entry_id: str, namespace: str, model: str, tokens: tuple[int, ...],
                     prompt_length: int, round: int, hint_key: str | None, kept: Any, state: Any) -> Any:
        """The SSD writer's job for a finished request (`kept`: its entry's handle, None when not kept)."""
        ...

    def check(self, kept: Any, length: int) -> None:
        """Assert that a kept handle still holds `length` tokens."""
        ...
