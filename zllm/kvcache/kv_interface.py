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

from collections.abc import Callable
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

    # ------------------------------------------------------------------ the SSD tier (kvcache/snapshot_store.py)

    # what makes an exported payload loadable (model, backend, KV types): a snapshot written for another is set aside
    snapshot_layout: str
    # bytes per token of an export when it is token-major (token t at [t * token_bytes, (t + 1) * token_bytes):
    # a restore reads only the range it lacks); 0 when an export is loaded whole
    token_bytes: int

    def export(self, kept: Any, state: Any, length: int) -> Callable[[], Any]:
        """Engine thread: what the SSD writer calls (on its own thread) for the payload of a finished request's
        first `length` tokens (`kept`: its entry's handle, None when not kept; `state`: the request's KV)."""
        ...

    def load(self, running: Any, payload: Any, first: int, length: int, stored: int) -> Any:
        """Engine thread: the running sequence now holding tokens [0, length), `payload` holding [first, length)
        of a `stored`-token snapshot (token-major) or all of it (whole: cropped to `length`). Raises
        SnapshotInvalid when the engine refuses it (the cache quarantines the snapshot)."""
        ...

    def check(self, kept: Any, length: int) -> None:
        """Assert that a kept handle still holds `length` tokens."""
        ...
