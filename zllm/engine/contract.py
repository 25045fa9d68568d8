"""The engine seam: what the runtime asks of an engine backend, and nothing more.

    seq = engine.open(lease)                 empty, or continuing the lease's cached prefix of N tokens (a lease
                                             of this backend's prefix cache: kvcache/contract.py)
    logits = engine.step([Row(seq, ids), Row(seq2, draft, all_logits=True), ...])
                                             one step over every row: [vocab] after a row's last token,
                                             [n, vocab] after each of its n tokens for all_logits rows
    engine.length(seq)                       tokens the sequence holds (positions continue from here)
    engine.crop(seq, n)                      forget every token past the first n (rejected drafts)
    engine.release(seq)                      give its memory back (a failed request)
    engine.kept_state(seq)                   what the prefix cache keeps when the request ends
    engine.export_state(seq) / import_state(data)   a sequence as bytes and back (the SSD tier)
    engine.step_rows                         the fewest tokens a step computes (2: a lone token gets a pad row,
                                             which a 1-token speculative draft can take instead, for free)
    engine.verify_rows                       the most tokens one row may feed and still get, after each, the
                                             bits 1-token steps give (a speculative draft's limit + 1)
    engine.verify_row_cost                   what one more verified row costs, in steps (None: not measured;
                                             speculation's cost gate then stays off)

Backends: `torch` (engine/torch/runner.py: transformers, a `DynamicCache` per sequence, packed forwards) and
`llamacpp` (engine/llamacpp/: GGUF as it is, one `llama_decode` per step over every row, sequences in one
unified KV pool). Only a backend imports its engine library.

Logits are arrays of the backend's kind ([vocab] float): numpy in host memory for llama.cpp (`device` None),
torch tensors on the model's device for torch. The sampler, fences, loop guard and speculative verifier take
either (engine/sampler.py: one rule, numpy kernels and torch kernels for a GPU's logits), so the runtime never
imports torch itself and sampling behaves the same whatever computed the logits.

    with engine.engine_thread(threads): ...  what the engine thread runs under (torch: its per-thread
                                             intra-op count and inference mode; llama.cpp: nothing)
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the cache seam: a backend's open() reads the lease its own prefix cache made
    from zllm.kvcache.contract import CacheLease

# A backend's own handle for one sequence (a DynamicCache; a llama.cpp sequence id wrapper). Opaque here.
EngineSequence = Any
# One row of logits ([vocab]) or several ([n, vocab]): a numpy array (llama.cpp) or a torch tensor (torch)
Logits = Any


@dataclass(frozen=True)
class Row:
    """One row of a step: tokens appended to one sequence."""

    seq: EngineSequence
    token_ids: Sequence[int]
    all_logits: bool = False  # logits after every token (a speculative verify), else after the last only

    def __post_init__(self) -> None:
        assert len(self.token_ids) > 0, "every row feeds at least one token"


@dataclass(frozen=True)
class KeptState:
    """What the prefix cache keeps of a finished sequence: `state` is the backend's (per-layer tensors for
    torch, the sequence itself for llama.cpp), `buffers` the working buffers it ended with (torch only)."""

    state: Any
    buffers: Any = None


UNBOUNDED_ROWS = 1 << 30  # verify_rows of an engine that promises no bound of its own


class Engine(Protocol):
    backend: str
    device: Any  # torch.device the logits live on; None: numpy arrays in host memory
    step_rows: int  # the fewest tokens a step computes
    verify_rows: int  # the most tokens a verify may feed and keep 1-token steps' bits
    verify_row_cost: float | None  # a verified row past step_rows, in steps (runtime/speculative.py's CostGate)

    def engine_thread(self, threads: int) -> AbstractContextManager: ...

    def open(self, lease: CacheLease | None = None) -> EngineSequence: ...

    def step(self, rows: Sequence[Row]) -> list[Logits]: ...

    def length(self, seq: EngineSequence) -> int: ...

    def can_crop(self, seq: EngineSequence) -> bool: ...

    def crop(self, seq: EngineSequence, length: int) -> None: ...

    def release(self, seq: EngineSequence) -> None: ...

    def kept_state(self, seq: EngineSequence) -> KeptState: ...
