"""A GGUF draft model on llama.cpp: greedy drafts from a small model with the served model's vocabulary, verified
by the target like prompt-lookup drafts (runtime/speculative.py). The torch backend's counterpart is
engine/torch/draft_model.py; the verifier's rules are the same (a greedy drafter is deterministic, so greedy
output equals the plain loop's and sampled output is distributed as p: the draft only decides how many tokens a
verify forward gets right).

One `LlamaDraftModel` per daemon: its own llama.cpp context, a small unified KV pool of DRAFT_CELLS cells, and
DRAFT_SLOTS sequences ("slots"). Each request's `LlamaDrafter` takes a slot while it lives (more requests than
slots take them from each other); a slot keeps its cells after the request ends, so the next request picks the free slot holding the longest common prefix of its
own tokens and feeds only the rest (the next turn of a conversation feeds only its new messages, not the whole
prompt again):

    slot cells       s s s s s s s o o t d d        what the draft KV holds (a token list kept beside it)
    wanted           s s s s s s s o o t t          the sequence (prompt + emitted) + this step's tail
    propose()        keep the common prefix (llama_memory_seq_rm past it), feed the rest, then k greedy tokens

so rejected drafts are rolled back at the next propose, and tokens a verify accepted were usually fed by the
propose before it. The draft sees the sequence from a start position (`window_start`) that the next turns of a
conversation keep while they fit the window, and stops drafting when the sequence outgrows it (the target then
decodes plainly). Engine thread only.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp as lc
import numpy as np

from zllm.engine.llamacpp.backend import LlamaCppEngine, free_llama, kv_shape_of, thread_count
from zllm.errors import ConfigError, EngineFailure
from zllm.model_files import GGUF_FILE
from zllm.token_prefix import common_prefix_length

log = logging.getLogger("zllm.engine")

# tokens of the sequence one drafter sees at most (its most recent ones, from `window_start`)
DRAFT_WINDOW = 4096
# the part of the window a slot's view keeps free for the answer when a new turn reuses it (else the view moves on)
OUTPUT_ROOM = 1 / 8
# cells of the draft's KV pool, shared by its slots: one full window and room for the other slots' prefixes
DRAFT_CELLS = 2 * DRAFT_WINDOW
# sequences of the draft's KV pool: requests that keep their draft cells while drafting at once
DRAFT_SLOTS = 8
DRAFT_BATCH = 512  # tokens per llama_decode when the draft catches up on a prompt
_HINT = "use a draft model of the same family as the served model (one that ships the same tokenizer)"


def draft_gguf(path: Path) -> Path:
    """The GGUF file of a draft model given as a model directory or as a .gguf file."""
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path
    if (path / GGUF_FILE).is_file():
        return path / GGUF_FILE
    raise ConfigError(f"the draft model {path} holds no {GGUF_FILE}",
                      hint="on the llama.cpp backend a draft model is a GGUF model (a store name or a .gguf file)")


@dataclass(eq=False)
class _Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what its cells hold, position by position
    start: int = 0  # the sequence position its first cell holds
    owner: weakref.ref | None = None  # the drafter using it (a dead reference: free)
    used_at: float = 0.0

    @property
    def free(self) -> bool:
        return self.owner is None or self.owner() is None


class LlamaDraftModel:
    """The loaded draft model, shared by every request's drafter (engine thread only)."""

    def __init__(self, gguf: Path, target: LlamaCppEngine, *, threads: int = 0, cells: int = DRAFT_CELLS,
                 window: int = DRAFT_WINDOW, slots: int = DRAFT_SLOTS):
        lc.llama_backend_init()
        self.path = gguf
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0x7FFFFFFF if lc.llama_supports_gpu_offload() else 0
        self.model = lc.llama_model_load_from_file(str(gguf.resolve()).encode(), params)
        if not self.model:
            raise ConfigError(f"llama.cpp could not load the draft model {gguf}", hint=_HINT)
        try:
            self.proposable = check_shared_vocabulary(target.model, self.model)
            trained = lc.llama_model_n_ctx_train(self.model)
            self.window = min(window, trained) if trained > 0 else window
            self.ctx = lc.llama_init_from_model(self.model, _context_params(max(cells, self.window), slots, threads,
                                                                            _heads_fit_q8_0(self.model)))
            if not self.ctx:
                raise EngineFailure("llama.cpp could not create the draft model's context")
        except BaseException:
            lc.llama_model_free(self.model)
            raise
        self.memory = lc.llama_get_memory(self.ctx)
        self.vocab_size = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self._batch = lc.llama_batch_init(DRAFT_BATCH, 0, 1)
        self.slots = [_Slot(seq_id) for seq_id in range(slots)]
        self.fed = 0  # tokens fed to the draft model (prompt catch-up and drafts): what reuse saves shows here

    def close(self) -> None:
        if self.ctx:
            free_llama(self.ctx, self.model, self._batch)
            self.ctx = self.model = None

    def drafter_for(self, prompt_ids: Sequence[int]) -> LlamaDrafter:
        """A drafter for one request (its slot is taken at its first propose)."""
        return LlamaDrafter(self, list(prompt_ids))

    # ------------------------------------------------------------------ slots

    def take_slot(self, drafter: LlamaDrafter, sequence: Sequence[int]) -> _Slot:
        """A slot for `sequence`: the free one whose cells share the longest prefix with it, from the position the
        slot starts at (a previous turn of the conversation: its start is kept while the sequence fits its window
        with OUTPUT_ROOM to spare); else the least recently used free one, starting at `window_start`. When every
        slot drafts for a live request (more requests than slots, or a finished one not collected yet) a slot is
        taken from its drafter, which takes one back at its next propose (`LlamaDrafter.owns`): drafts stay right,
        only reuse is lost."""
        candidates = [slot for slot in self.slots if slot.free] or self.slots

        def reuse(slot: _Slot) -> int:
            fits = slot.start <= len(sequence) - 1 and len(sequence) - slot.start <= self.window * (1 - OUTPUT_ROOM)
            return common_prefix_length(slot.tokens, sequence[slot.start:]) if fits and slot.tokens else 0

        slot = max(candidates, key=lambda s: (reuse(s), -s.used_at))
        if not reuse(slot):
            self.forget(slot, 0)
            slot.start = window_start(len(sequence), self.window)
        slot.owner = weakref.ref(drafter)
        return slot

    def forget(self, slot: _Slot, length: int) -> None:
        """Drop the slot's cells from `length` on."""
        if length < len(slot.tokens):
            lc.llama_memory_seq_rm(self.memory, slot.seq_id, length, -1)
            del slot.tokens[length:]

    def _make_room(self, keep: _Slot) -> bool:
        """Free the least recently used idle slot's cells (the pool is full); False when none holds any."""
        idle = [slot for slot in self.slots if slot is not keep and slot.free and slot.tokens]
        if not idle:
            return False
        self.forget(min(idle, key=lambda s: s.used_at), 0)
        return True

    # ------------------------------------------------------------------ decoding

    def feed(self, slot: _Slot, tokens: Sequence[int]) -> np.ndarray | None:
        """Append `tokens` to the slot's cells; the logits after the last one ([vocab]), None when the pool has no
        room for them even with every idle slot emptied (the slot is then emptied too: nothing half-written)."""
        for start in range(0, len(tokens), DRAFT_BATCH):
            chunk = tokens[start:start + DRAFT_BATCH]
            status = self._decode(slot, chunk)
            while status == 1 and self._make_room(slot):
                status = self._decode(slot, chunk)
            if status != 0:
                self.forget(slot, 0)
                return None
            slot.tokens.extend(chunk)
            self.fed += len(chunk)
        pointer = lc.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.vocab_size,))  # read before the next decode

    def _decode(self, slot: _Slot, chunk: Sequence[int]) -> int:
        batch, first = self._batch, len(slot.tokens)
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = first + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = slot.seq_id
            batch.logits[i] = i == len(chunk) - 1
        batch.n_tokens = len(chunk)
        status = lc.llama_decode(self.ctx, batch)
        if status != 0:  # positions past a failed decode are undefined: drop what it may have written
            lc.llama_memory_seq_rm(self.memory, slot.seq_id, first, -1)
        return status


def _context_params(cells: int, slots: int, threads: int, q8_0_cells: bool):
    params = lc.llama_context_default_params()
    if q8_0_cells:  # the draft's KV bits do not matter (the target verifies): half the memory of F16 cells
        params.type_k = params.type_v = lc.GGML_TYPE_Q8_0
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
    params.n_ctx = cells
    params.n_batch = params.n_ubatch = DRAFT_BATCH
    params.n_seq_max = slots
    params.kv_unified = True  # the slots share one pool: an idle slot's prefix costs only its own cells
    params.n_threads = params.n_threads_batch = thread_count(threads)
    params.no_perf = True
    return params


def _heads_fit_q8_0(model) -> bool:
    """Whether Q8_0 cells (32-element blocks) can hold the model's key and value rows (read from the loaded model:
    a second vocab-only load of a 150K-token vocabulary costs a second)."""
    try:
        return kv_shape_of(model)[2] % 32 == 0
    except ValueError:  # a key written per layer (an array): keep F16 cells
        return False


def check_shared_vocabulary(target, draft) -> int:
    """Every id must mean the same token in both models (drafts and the sequence travel between them as ids):
    the same vocabulary type and size, the same special tokens, the same text for every id. Returns how many ids
    the draft may propose. `target` and `draft` are llama.cpp models."""
    target_vocab, draft_vocab = lc.llama_model_get_vocab(target), lc.llama_model_get_vocab(draft)
    sizes = lc.llama_vocab_n_tokens(target_vocab), lc.llama_vocab_n_tokens(draft_vocab)
    if sizes[0] != sizes[1]:
        raise ConfigError(f"the draft model's vocabulary has {sizes[1]} tokens, the served model's {sizes[0]}",
                          hint=_HINT)
    if lc.llama_vocab_type(target_vocab) != lc.llama_vocab_type(draft_vocab):
        raise ConfigError("the draft model's tokenizer is of another kind than the served model's", hint=_HINT)
    specials = {name: (getattr(lc, f"llama_vocab_{name}")(target_vocab),
                       getattr(lc, f"llama_vocab_{name}")(draft_vocab)) for name in ("bos", "eos", "eot", "sep", "pad")}
    specials["add_bos"] = (lc.llama_vocab_get_add_bos(target_vocab), lc.llama_vocab_get_add_bos(draft_vocab))
    differing = [f"{name} {ids[0]} vs {ids[1]}" for name, ids in specials.items() if ids[0] != ids[1]]
    if differing:
        raise ConfigError(f"the draft model's special tokens differ from the served model's ({', '.join(differing)})",
                          hint=_HINT)
    mismatched = [i for i in range(sizes[0])
                  if lc.llama_vocab_get_text(target_vocab, i) != lc.llama_vocab_get_text(draft_vocab, i)]
    if mismatched:
        example = mismatched[0]
        raise ConfigError(
            f"the draft model's tokenizer differs from the served model's: {len(mismatched)} of {sizes[0]} token "
            f"ids have another text (e.g. id {example}: "
            f"{lc.llama_vocab_get_text(target_vocab, example)!r} vs {lc.llama_vocab_get_text(draft_vocab, example)!r})",
            hint=_HINT)
    return sizes[0]


def window_start(length: int, window: int) -> int:
    """Where a new view of a `length`-token sequence starts: 0 while it fits in 3/4 of the window, else the
    multiple of window/4 that leaves at most half the window to prefill, so the conversation can grow by about
    half a window (turns, each reusing the cells: `take_slot`) before the view moves on."""
    step = max(window // 4, 1)
    if length <= window - step:
        return 0
    return -(-(length - window // 2) // step) * step


@dataclass(eq=False)
class LlamaDrafter:
    """Greedy drafts from the draft model over prompt + output (runtime/speculative.py's Drafter)."""

    model: LlamaDraftModel
    _sequence: list[int] = field(repr=False)  # prompt + emitted tokens
    _slot: _Slot | None = field(init=False, default=None, repr=False)
    _off: bool = field(init=False, default=False)  # no room in the draft's pool: this request drafts nothing more

    def __len__(self) -> int:
        return len(self._sequence)

    def extend(self, tokens: Iterable[int]) -> None:
        self._sequence.extend(tokens)  # the cells catch up at the next propose

    @property
    def cached(self) -> int:
        """Tokens the slot's cells hold (0 before the first propose)."""
        return len(self._slot.tokens) if self._slot is not None else 0

    @property
    def owns(self) -> bool:
        """Whether the slot is still this drafter's (another request may have taken it: `take_slot`)."""
        return self._slot is not None and self._slot.owner is not None and self._slot.owner() is self

    def propose(self, limit: int, tail: Sequence[int] = ()) -> list[int]:
        """Up to `limit` greedy tokens of the draft model after sequence + `tail` (tokens chosen this step, not in
        the sequence yet); empty when the sequence has outgrown the draft's window or the draft has no room."""
        if limit <= 0 or self._off or not self._sequence:
            return []
        model = self.model
        if not self.owns:
            self._slot = model.take_slot(self, self._sequence)
        wanted = [*self._sequence[self._slot.start:], *tail]
        limit = min(limit, model.window - len(wanted))
        if limit <= 0:
            return []
        slot = self._slot
        slot.used_at = time.monotonic()
        kept = common_prefix_length(slot.tokens, wanted)
        model.forget(slot, min(kept, len(wanted) - 1))  # the last wanted token is fed again for its logits
        draft: list[int] = []
        logits = model.feed(slot, wanted[len(slot.tokens):])
        while logits is not None:
            draft.append(int(np.argmax(logits[:model.proposable])))
            if len(draft) == limit:
                break
            logits = model.feed(slot, draft[-1:])  # the last draft token is proposed, never fed
        if logits is None:
            self._off = True
        return draft
