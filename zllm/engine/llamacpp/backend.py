"""`LlamaCppEngine`: the engine seam (engine/contract.py) over one llama.cpp context.

One context, one unified KV pool (`kv_unified`), many sequences by id:

    open()            a free sequence id, empty
    open(lease)       the lease's sequence: the prefix cache already shared (seq_cp) or restored its prefix
    step(rows)        ONE llama_decode over every row's tokens, each token tagged with its row's sequence id
                      and position; logits requested after a row's last token (or after each, all_logits)
    crop(seq, n)      llama_memory_seq_rm(seq, n, -1)
    share(seq, n)     a new sequence whose first n cells ARE seq's (seq_cp in a unified pool: no copy)
    export/import     llama_state_seq_get_data / set_data: a sequence as bytes (the SSD tier)

`kv_unified` is what makes sharing work: without it each sequence has its own stream and a batch that
mixes sequences after a seq_cp fails (design/ENGINE.md). Positions are tracked here per sequence, and
llama.cpp checks them: a row continues exactly at its sequence's length.

Logits come back as numpy arrays ([vocab] float32, copied out of llama.cpp's buffer, which the next decode
overwrites; [n, vocab] for an all_logits row): sampling, fences and the speculative verifier are zllm's, the
same on both backends, and nothing on this path imports torch.
Engine thread only: a llama.cpp context is not thread-safe.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace

import llama_cpp as lc
import numpy as np

from zllm.engine.contract import UNBOUNDED_ROWS, KeptState, Row
from zllm.engine.llamacpp.load_measures import LoadMeasures
from zllm.engine.llamacpp.row_agreement import SPLIT_ATTENTION_CELLS, agreeing_rows
from zllm.engine.llamacpp.verify_cost import attention_cell_cost, verify_row_cost
from zllm.errors import EngineFailure

log = logging.getLogger("zllm.engine")

logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # its log callback prints everything otherwise


@dataclass(eq=False)
class LlamaSequence:
    """One sequence in the context's KV pool: its id and how many tokens (positions 0..length-1) it holds."""

    seq_id: int
    length: int = 0
    released: bool = False


@dataclass(frozen=True)
class Attention:
    flash_attention: int
    kv_type: int
    exact: bool = False  # ContextSettings.exact: uniform batch shapes and cells kept in position order


# Answers that do not depend on the cache's state (issue 22; bench/cache_exactness.py measures it). llama.cpp's
# CPU attention over F16 cells picks a kernel by shape: a tiled one for >= 64 query rows (64-cell KV tiles at
# absolute cell indices: sums grouped by where a sequence's cells sit in the pool), a KV-split one for a single
# query row (split by thread at n_kv / threads: n_kv is padded to the pool's highest used cell), else the
# per-cell one; without flash attention, softmax and KQV reduce over n_kv in SIMD lanes by cell index. So a
# cold prefill, one beside another sequence, and a continuation after a hit or an SSD restore differ (by up
# to ~1 logit on the default model). Over Q8_0 cells llama.cpp takes the per-cell flash-attention kernel for
# every shape: it walks the sequence's own cells in order and skips masked ones, so placement, padding,
# neighbours, ubatch size and threads leave the result unchanged; and KV memory is 34/64 of F16's.
# Two more things make a token's logits depend on the cache's state, and ContextSettings.exact removes both:
# - the matmul kernel: ggml sends a 1-row product to its vec_dot loop and a product of 2+ rows to llamafile's
#   tinyBLAS (sgemm.cpp: `if (n < 2) return false`), whose sums group differently. tinyBLAS computes each
#   output element as ONE vector accumulator over k in order (gemm_bloc), whatever the tile shape, the row
#   count or the thread that takes the tile, so if every product has 2+ rows, every product agrees. A product's
#   rows are a ubatch's tokens, or (last layer's FFN and the output head) its tokens that want logits: so no
#   ubatch of 1 token (a pad token in a scratch sequence joins it) and no ubatch with exactly 1 output.
# - the order of the cells: the per-cell kernel sums a sequence's cells in pool order, and llama.cpp's find_slot
#   places new cells from its cursor, which a freed cell below it pulls back (seq_rm), or from cell 0 once the
#   free space before the cursor is large: a continuation then lands in a hole BEFORE its own prefix. With no
#   free cell below a used one, every new cell goes after every used cell; so after cells are freed the pool is
#   compacted before the next placement (a whole-context state save and restore: llama.cpp packs the cells from
#   0 in their order, sharing kept).
EXACT_ATTENTION = Attention(lc.LLAMA_FLASH_ATTN_TYPE_ENABLED, lc.GGML_TYPE_Q8_0, exact=True)
FAST_ATTENTION = Attention(lc.LLAMA_FLASH_ATTN_TYPE_AUTO, lc.GGML_TYPE_F16)
# `--cache-type q8_0` (llama.cpp's -ctk/-ctv q8_0 -fa on): Q8_0 cells, which need flash attention for V, and
# llama.cpp's own choice of kernel (on CPU the per-cell one for every shape: its tiled one reads F16 cells only)
Q8_0_ATTENTION = Attention(lc.LLAMA_FLASH_ATTN_TYPE_ENABLED, lc.GGML_TYPE_Q8_0)
# query rows from which llama.cpp's CPU attention over F16 cells takes its tiled kernel (ggml's GGML_FA_TILE_Q)
TILED_ATTENTION_ROWS = 64
KV_TYPE_BYTES = {lc.GGML_TYPE_F16: (2, 1), lc.GGML_TYPE_Q8_0: (34, 32)}  # bytes per element, as (num, den)
KV_TYPE_NAMES = {lc.GGML_TYPE_F16: "f16", lc.GGML_TYPE_Q8_0: "q8_0"}  # as --cache-type (and llama.cpp's -ctk) name them


@dataclass(frozen=True)
class ContextSettings:
    cells: int  # KV cells in the unified pool: every running row and every kept entry share them
    max_sequences: int = 64  # llama.cpp allows up to 256 (LLAMA_MAX_SEQ)
    threads: int = 0  # 0 = the machine's cores
    batch: int = 2048  # tokens per llama_decode (a step with more is split)
    ubatch: int = 512  # tokens per compute graph inside a decode (llama.cpp's n_ubatch)
    gpu_layers: int = -1  # layers offloaded to a GPU build (-1 = all); ignored by the CPU build
    flash_attention: int = lc.LLAMA_FLASH_ATTN_TYPE_AUTO
    kv_type: int = lc.GGML_TYPE_F16  # K and V cells' type (a quantized one needs flash attention)
    exact: bool = False  # EXACT_ATTENTION's comment: no 1-row product, cells in position order (two sequence
    #                      ids are kept: the pad tokens', and the dead cells')
    # a token's logits are the same bits whether it is decoded alone or verified among drafted tokens, so
    # speculation never changes a greedy answer. Where the model's kernels already agree for 1 row and a verify's
    # rows (measured at load: row_agreement.py; quantized weights such as Q4_1), nothing changes but the drafts'
    # length (`verify_rows`). Else no product has 1 row in any decode (a pad token joins a lone one:
    # EXACT_ATTENTION's comment; one sequence id is kept for the pad tokens), and F16 cells are read by the
    # per-cell attention kernel (2..63 query rows). The pad costs a second row in every 1-token step (~0.7x
    # decode at 1 thread on the F16 default: bench/speculative_llamacpp.py), so it is on for a speculating
    # server only. exact implies the pad.
    uniform_rows: bool = False
    # uniform_rows may pad (--speculative on). False (--speculative auto): where the kernels need a pad row the
    # engine drops uniform_rows after measuring and decodes as a server that does not speculate (`needs_pad`)
    pad_allowed: bool = True

    def __post_init__(self) -> None:
        assert self.cells > 0 and 1 <= self.max_sequences <= 256 and self.threads >= 0
        assert self.batch >= 1 and 1 <= self.ubatch <= self.batch
        assert not self.padded or (self.ubatch >= 2 and self.max_sequences >= 3)

    @property
    def padded(self) -> bool:
        """Whether decodes are shaped so that no product has 1 row (`uniform_rows`, or `exact`)."""
        return self.exact or self.uniform_rows


def free_llama(ctx, model, batch) -> None:
    """Free a batch, its context and the model under it, in that order (llama.cpp's lifetimes)."""
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)


class LlamaCppEngine:
    backend = "llamacpp"
    device = None  # logits are numpy arrays in host memory (engine/contract.py)

    def __init__(self, gguf_path: str, settings: ContextSettings, measures: LoadMeasures | None = None):
        """`measures`: where the load-time measures of a speculating engine are kept across loads (None: measure
        every time)."""
        lc.llama_backend_init()
        self.settings = settings
        self._gguf_path = gguf_path
        self._measures = measures
        model_params = lc.llama_model_default_params()
        # -1 = every layer (the C API wants a count: more layers than the model has means all of them)
        layers = 0x7FFFFFFF if settings.gpu_layers < 0 else settings.gpu_layers
        model_params.n_gpu_layers = layers if lc.llama_supports_gpu_offload() else 0
        self.model = lc.llama_model_load_from_file(gguf_path.encode(), model_params)
        if not self.model:
            raise EngineFailure(f"llama.cpp could not load {gguf_path}")
        self.ctx = lc.llama_init_from_model(self.model, self._context_params(settings))
        if not self.ctx:
            lc.llama_model_free(self.model)
            raise EngineFailure("llama.cpp could not create a context", hint="lower the cache budget (KV cells)")
        self.memory = lc.llama_get_memory(self.ctx)
        self.vocab_size = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.cells = lc.llama_n_ctx(self.ctx)
        self._batch = lc.llama_batch_init(settings.batch, 0, 1)
        self._free_ids = list(range(settings.max_sequences - 1, -1, -1))  # pop() hands out 0 first
        self._pad_id = self._free_ids.pop(0) if settings.padded else None  # the pad tokens' scratch sequence
        # exact: released and cropped cells go to this sequence instead of being freed (no hole below a used cell)
        # until the pool is full, when they are dropped and the pool compacted (`_compact`)
        self._dead_id = self._free_ids.pop(0) if settings.exact else None
        self._dead = False  # exact: the dead sequence holds cells
        self._holes = False  # exact: cells were freed (a failed decode) since the pool was last compacted
        self._top: tuple[int, int] | None = None  # exact: (sequence id, first position) when the last decode
        #                                           placed one sequence's cells only: the pool's highest ones
        self.compactions = 0
        self._rows_agree = False  # measured: a verify's rows give 1-token decoding's bits with no pad row
        # measured under uniform_rows (None: not measured): why exact speculation needs a pad row on this model
        # ("": it needs none)
        self.needs_pad: str | None = None
        self.bytes_per_token = self._measure_bytes_per_token()
        # the most tokens one decode may verify and still give 1-token decoding's bits (speculation's drafts)
        # (UNBOUNDED_ROWS when no exactness is promised: no uniform_rows)
        self.verify_rows = TILED_ATTENTION_ROWS - 1 if self._pads else UNBOUNDED_ROWS
        # what one more verified row costs, in steps (verify_cost.py): speculation's gate; None where no server
        # speculates (measured at load for a speculating one)
        self.verify_row_cost: float | None = None
        self.attention_cell_cost = 0.0  # what a verified row's attention adds per cell of its sequence, in steps
        if settings.uniform_rows and not settings.exact:
            self._measure_row_agreement()
            if self.needs_pad and not settings.pad_allowed:
                self._drop_uniform_rows()
        if self.settings.uniform_rows:
            self._measure_verify_cost()

    @staticmethod
    def _context_params(settings: ContextSettings):
        params = lc.llama_context_default_params()
        params.n_ctx = settings.cells
        params.n_batch = settings.batch
        params.n_ubatch = settings.ubatch
        params.n_seq_max = settings.max_sequences
        params.kv_unified = True  # one pool shared by sequence ids: prefix sharing by seq_cp
        threads = thread_count(settings.threads)
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = settings.flash_attention
        params.type_k = params.type_v = settings.kv_type
        params.no_perf = True
        return params

    @staticmethod
    def estimate_bytes_per_token(gguf_path: str, kv_type: int = lc.GGML_TYPE_F16) -> int:
        """K and V of `kv_type` per layer per token, from the model's shape (before a context exists to measure)."""
        layers, kv_heads, head_dim = _kv_shape(gguf_path)
        num, den = KV_TYPE_BYTES[kv_type]
        return max(2 * layers * kv_heads * head_dim * num // den, 1)

    @staticmethod
    def exact_attention_fits(gguf_path: str) -> bool:
        """Whether EXACT_ATTENTION's Q8_0 cells can hold this model's heads (a Q8_0 row is 32-element blocks;
        tiny test models have 16-wide heads)."""
        try:
            return _kv_shape(gguf_path)[2] % 32 == 0
        except ValueError:  # a shape key written per layer (an array): keep llama.cpp's default cells
            return False

    def close(self) -> None:
        if self.ctx:
            free_llama(self.ctx, self.model, self._batch)
            self.ctx = self.model = None

    # ------------------------------------------------------------------ facts

    @property
    def model_bytes(self) -> int:
        return lc.llama_model_size(self.model)

    @property
    def parameters(self) -> int:
        return lc.llama_model_n_params(self.model)

    @property
    def kv_bytes(self) -> int:
        return self.cells * self.bytes_per_token

    @property
    def _pads(self) -> bool:
        """Whether a lone token gets a pad row (`_pad`): when padded, unless the kernels agree without one."""
        return self.settings.exact or (self.settings.uniform_rows and not self._rows_agree)

    @property
    def step_rows(self) -> int:
        """The fewest tokens a step computes: a lone token gets a pad row when padded."""
        return 2 if self._pads else 1

    @property
    def free_sequences(self) -> int:
        return len(self._free_ids)

    def _measure_bytes_per_token(self) -> int:
        """KV bytes one token adds to a sequence's state (the state of 2 tokens minus that of 1).

        Decoded on ONE thread: this runs on the loading thread, and a multi-threaded decode there leaves an
        OpenMP thread team behind that slows every later decode on the engine thread at 2 threads
        (bench/llamacpp_engine.py shows it)."""
        threads = thread_count(self.settings.threads)
        lc.llama_set_n_threads(self.ctx, 1, 1)
        seq = self.open()
        try:
            self.step([Row(seq, [0])])
            one = lc.llama_state_seq_get_size(self.ctx, seq.seq_id)
            self.step([Row(seq, [0])])
            return max(lc.llama_state_seq_get_size(self.ctx, seq.seq_id) - one, 1)
        finally:
            self.release(seq)
            lc.llama_set_n_threads(self.ctx, threads, threads)

    def _measure_row_agreement(self) -> None:
        """Pad only where a verify's rows would otherwise differ from 1-token decoding (row_agreement.py). Over
        F16/F32 cells at 2+ threads one query row takes the KV-split attention, split by thread: always pad there.
        Measured on ONE thread, as `_measure_bytes_per_token` (the kernels' sums do not depend on the count)."""
        threads = thread_count(self.settings.threads)
        if threads > 1 and self.settings.kv_type in (lc.GGML_TYPE_F16, lc.GGML_TYPE_F32):
            self.needs_pad = (f"at {threads} threads one query row over F16 cells takes the KV-split attention; "
                              f"--threads 1 or --cache-type q8_0 avoid it")
            return
        lc.llama_set_n_threads(self.ctx, 1, 1)
        self._rows_agree = True  # decode unpadded while measuring
        try:
            rows = self._kept("agreeing_rows", lambda: agreeing_rows(self))
        finally:
            lc.llama_set_n_threads(self.ctx, threads, threads)
            self._rows_agree = False
        if rows < 2:
            self.needs_pad = "a verify's rows take other kernels than a 1-token step"
            return
        self.needs_pad = ""
        self._rows_agree = True
        self.verify_rows = rows
        self._release_pad_id()
        log.info("llama.cpp: verified drafts give 1-token decoding's bits up to %d rows: no pad row", rows)

    def _drop_uniform_rows(self) -> None:
        """Decode as a server that does not speculate (ContextSettings.pad_allowed False): no pad row, no bound
        on a decode's rows, the pad tokens' sequence id back among the free ones."""
        self.settings = replace(self.settings, uniform_rows=False)
        self.verify_rows = UNBOUNDED_ROWS
        self._release_pad_id()
        log.debug("llama.cpp: no pad row: exact speculation would need one (%s)", self.needs_pad)

    def _release_pad_id(self) -> None:
        """No pad tokens from here on: their sequence id serves requests."""
        self._free_ids.append(self._pad_id)
        self._pad_id = None

    def _measure_verify_cost(self) -> None:
        threads = thread_count(self.settings.threads)
        lc.llama_set_n_threads(self.ctx, 1, 1)  # as `_measure_bytes_per_token`
        try:
            self.verify_row_cost = self._kept("verify_row_cost", lambda: verify_row_cost(self))
            self.attention_cell_cost = attention_cell_cost(self)
        finally:
            lc.llama_set_n_threads(self.ctx, threads, threads)
        log.info("llama.cpp: a verified row costs %.2f of a decode step", self.verify_row_cost)

    def _kept(self, name: str, measure):
        """A load-time measure, from `measures` when an earlier load of this file with this build kept it."""
        if self._measures is None:
            return measure()
        key = self._measures.key(self._gguf_path, kv_type=self.settings.kv_type,
                                 flash_attention=self.settings.flash_attention,
                                 long_prompt=min(SPLIT_ATTENTION_CELLS + 64, self.cells // 2))
        entry = self._measures.get(key) or {}
        if name not in entry:
            entry = {**entry, name: measure()}
            self._measures.put(key, entry)
        else:
            log.debug("llama.cpp: %s kept from an earlier load: %s", name, entry[name])
        return entry[name]

    # ------------------------------------------------------------------ the engine seam

    @staticmethod
    def engine_thread(threads: int) -> nullcontext:
        """llama.cpp keeps its own thread count per context (ContextSettings.threads): nothing to enter."""
        return nullcontext()

    def open(self, lease=None) -> LlamaSequence:
        if lease is not None:
            return lease.kv  # the running sequence the prefix cache opened (engine/llamacpp/kv.py)
        if not self._free_ids:
            raise EngineFailure("every llama.cpp sequence is in use", hint="lower --max-batch or the cache rounds")
        return LlamaSequence(self._free_ids.pop())

    def step(self, rows: Sequence[Row]) -> list[np.ndarray]:
        """One llama_decode per `batch` tokens (one for any ordinary step) over every row's tokens; when padded
        one per ubatch (`_exact_chunks`), and over F16 cells decoding rows apart from prefill ones (`_row_groups`)."""
        results: list[np.ndarray | None] = [None] * len(rows)
        for group in self._row_groups(rows):
            for index, logits in zip(group, self._step_rows([rows[i] for i in group])):
                results[index] = logits
        return results

    def _row_groups(self, rows: Sequence[Row]) -> list[list[int]]:
        """The rows (indices) each group of decodes takes: all at once, except for uniform rows. Padded over F16
        cells, llama.cpp's attention takes its tiled kernel for a ubatch of TILED_ATTENTION_ROWS+ tokens (other
        sums than the per-cell kernel's); unpadded, kernels agree up to `verify_rows` tokens only. So a decoding
        row (one token, or a draft to verify) beside a prefill chunk would get other bits than alone: decoding
        rows go in decodes of fewer tokens, prefill rows after them."""
        limit = self._decoding_tokens()
        if limit is None:
            return [list(range(len(rows)))]
        decoding = [i for i, row in enumerate(rows) if row.all_logits or len(row.token_ids) == 1]
        groups: list[list[int]] = []
        size = 0
        for i in decoding:
            if not groups or size + len(rows[i].token_ids) > limit:
                groups.append([])
                size = 0
            groups[-1].append(i)
            size += len(rows[i].token_ids)
        prefilling = [i for i in range(len(rows)) if i not in set(decoding)]
        return groups + ([prefilling] if prefilling else [])

    def _decoding_tokens(self) -> int | None:
        """The most decoding tokens one decode may hold (`_row_groups`); None: no limit."""
        if not self.settings.padded:
            return None
        if not self._pads:
            return self.verify_rows
        return TILED_ATTENTION_ROWS - 1 if self.settings.kv_type == lc.GGML_TYPE_F16 else None

    def _step_rows(self, rows: Sequence[Row]) -> list[np.ndarray]:
        feeds = [(row.seq, token, row.seq.length + i, row.all_logits or i == len(row.token_ids) - 1)
                 for row in rows for i, token in enumerate(row.token_ids)]
        logits: list[np.ndarray] = []
        spans = (_exact_chunks(len(feeds), self.settings.ubatch) if self._pads
                 else [(start, start + self.settings.batch) for start in range(0, len(feeds), self.settings.batch)])
        for start, end in spans:
            logits.extend(self._decode(feeds[start:end]))
        for row in rows:
            row.seq.length += len(row.token_ids)
        results, cursor = [], 0
        for row in rows:
            if row.all_logits:
                results.append(np.stack(logits[cursor:cursor + len(row.token_ids)]))
                cursor += len(row.token_ids)
            else:
                results.append(logits[cursor])
                cursor += 1
        return results

    def _decode(self, feeds: list[tuple[LlamaSequence, int, int, bool]]) -> list[np.ndarray]:
        padded = self._pad(feeds) if self._pads else feeds
        if self._holes and self.settings.exact:
            self._compact()
        batch = self._batch
        for i, (seq, token, position, wants_logits) in enumerate(padded):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq.seq_id
            batch.logits[i] = wants_logits
        batch.n_tokens = len(padded)
        status = lc.llama_decode(self.ctx, batch)
        if status == 1 and self._dead:  # no room: the dead cells make it, packed below the live ones
            self._compact()
            status = lc.llama_decode(self.ctx, batch)
        if self._pads:
            # the pad cells are the last ones placed: freeing them leaves no hole below a used cell
            lc.llama_memory_seq_rm(self.memory, self._pad_id, -1, -1)
        if status != 0:
            # positions past a failed decode are undefined: drop what this batch may have written
            for seq in {seq for seq, *_ in feeds}:
                lc.llama_memory_seq_rm(self.memory, seq.seq_id, seq.length, -1)
            self._holes = True
            raise EngineFailure(f"llama_decode failed ({status}{': no room in the KV pool' if status == 1 else ''})",
                                hint="raise --cache-budget-mb or lower --max-batch")
        placed = {seq.seq_id for seq, *_ in feeds}
        self._top = (feeds[0][0].seq_id, feeds[0][2]) if len(placed) == 1 else None
        return [self._logits_at(i) for i, feed in enumerate(feeds) if feed[3]]  # _pad appends, never reorders

    def _pad(self, feeds: list[tuple[LlamaSequence, int, int, bool]]) -> list[tuple]:
        """`feeds` shaped so that no product has 1 row (EXACT_ATTENTION's comment): a lone token gets a pad token
        in the scratch sequence after it, and a lone output a second one (the pad, or the token before it); the
        extra outputs' logits are not handed out (`_decode` keeps the caller's flags)."""
        padded = list(feeds)
        if len(padded) == 1:
            seq, token, _, _ = padded[0]
            padded.append((LlamaSequence(self._pad_id), token, 0, True))
        outputs = [i for i, feed in enumerate(padded) if feed[3]]
        if len(outputs) == 1:
            other = outputs[0] - 1 if outputs[0] > 0 else outputs[0] + 1
            padded[other] = (*padded[other][:3], True)
        return padded

    def pack(self) -> None:
        """Free cells below used ones (parked or released sequences) given back: the live cells packed from cell 0,
        so the next cells placed go after them and attention's span (the highest used cell) is the live cells'."""
        self._compact()

    def _compact(self) -> None:
        """Drop the dead cells and pack every live one from cell 0, in their order (a whole-context state save and
        restore), so the next cells placed go after all of them: a sequence's cells stay in position order
        (EXACT_ATTENTION's comment). It costs a copy of the used cells and a clear of the whole pool (seconds for a
        64K-cell pool: README), so it runs when the pool is full of dead cells, not after each release."""
        if self._dead_id is not None:
            lc.llama_memory_seq_rm(self.memory, self._dead_id, -1, -1)
        self._dead = False
        size = lc.llama_state_get_size(self.ctx)
        buffer = (ctypes.c_uint8 * size)()
        written = lc.llama_state_get_data(self.ctx, buffer, size)
        if lc.llama_state_set_data(self.ctx, buffer, written) != written:
            raise EngineFailure("llama.cpp could not restore its own state while compacting the KV pool")
        self._holes = False
        self.compactions += 1

    def _logits_at(self, batch_index: int) -> np.ndarray:
        pointer = lc.llama_get_logits_ith(self.ctx, batch_index)
        return np.ctypeslib.as_array(pointer, shape=(self.vocab_size,)).copy()  # the next decode overwrites it

    @staticmethod
    def length(seq: LlamaSequence) -> int:
        return seq.length

    @staticmethod
    def can_crop(seq: LlamaSequence) -> bool:
        return True

    def crop(self, seq: LlamaSequence, length: int) -> None:
        assert 0 <= length <= seq.length, f"cannot crop a {seq.length}-token sequence to {length}"
        if length < seq.length:
            # a rejected draft of the last decode's only sequence frees the pool's highest cells: no hole below a
            # used one; any other crop's cells go dead
            on_top = self._top is not None and self._top[0] == seq.seq_id and length >= self._top[1]
            if self.settings.exact and not on_top:
                self._bury(seq, length)
            lc.llama_memory_seq_rm(self.memory, seq.seq_id, length, -1)
            seq.length = length

    def release(self, seq: LlamaSequence) -> None:
        if seq.released:
            return
        if self.settings.exact and seq.length > 0:
            self._bury(seq, 0)
        lc.llama_memory_seq_rm(self.memory, seq.seq_id, -1, -1)
        seq.released, seq.length = True, 0
        self._free_ids.append(seq.seq_id)

    def _bury(self, seq: LlamaSequence, length: int) -> None:
        """seq's cells from `length` on join the dead sequence (seq_cp: no copy), so removing them from seq frees
        none: the pool keeps no free cell below a used one (EXACT_ATTENTION's comment)."""
        lc.llama_memory_seq_cp(self.memory, seq.seq_id, self._dead_id, length, -1)
        self._dead = True

    @staticmethod
    def kept_state(seq: LlamaSequence) -> KeptState:
        return KeptState(seq)

    # ------------------------------------------------------------------ what the prefix cache asks for

    def share(self, source: LlamaSequence, length: int) -> LlamaSequence:
        """A new sequence holding `source`'s first `length` tokens, sharing their cells (no copy)."""
        assert 0 < length <= source.length
        seq = self.open()
        lc.llama_memory_seq_cp(self.memory, source.seq_id, seq.seq_id, 0, length)
        seq.length = length
        return seq

    def state_size(self, seq: LlamaSequence) -> int:
        return lc.llama_state_seq_get_size(self.ctx, seq.seq_id)

    def export_state(self, seq: LlamaSequence) -> memoryview:
        """The sequence's state (its KV cells and positions), as a view over a buffer of its own."""
        size = lc.llama_state_seq_get_size(self.ctx, seq.seq_id)
        buffer = (ctypes.c_uint8 * size)()
        written = lc.llama_state_seq_get_data(self.ctx, buffer, size, seq.seq_id)
        if written != size:
            raise EngineFailure(f"llama.cpp wrote {written} of {size} state bytes")
        return memoryview(buffer).cast("B")

    def import_state(self, data, length: int) -> LlamaSequence:
        """A new sequence from `export_state` bytes (any bytes-like; a writable one is loaded without a copy)
        of a `length`-token sequence; EngineFailure when llama.cpp refuses them (then nothing is held)."""
        seq = self.open()
        if self._holes and self.settings.exact:
            self._compact()  # llama.cpp places the restored cells like a decode's (find_slot)
        self._top = None
        view = memoryview(data).cast("B")
        array = ctypes.c_uint8 * len(view)
        buffer = array.from_buffer(view) if not view.readonly else array.from_buffer_copy(view)
        read = lc.llama_state_seq_set_data(self.ctx, buffer, len(view), seq.seq_id)
        if read != len(view) and (self._dead or not self.settings.exact):  # no room (in one run): packing makes it
            self._compact()
            read = lc.llama_state_seq_set_data(self.ctx, buffer, len(view), seq.seq_id)
        held = lc.llama_memory_seq_pos_max(self.memory, seq.seq_id) + 1
        if read != len(view) or held != length:
            seq.length = max(held, 0)
            self.release(seq)
            raise EngineFailure(f"llama.cpp refused a saved sequence (read {read} of {len(view)} bytes, "
                                f"{held} of {length} tokens)")
        seq.length = length
        return seq


def _exact_chunks(n: int, ubatch: int) -> list[tuple[int, int]]:
    """[start, end) pieces of n feeds, each at most one ubatch, none of 1 token unless n is 1 (then it is padded):
    llama.cpp cuts a decode into ubatches itself, and a 1-token remainder would take the 1-row matmul."""
    ends = list(range(ubatch, n, ubatch)) + [n]
    if len(ends) > 1 and ends[-1] - ends[-2] == 1:
        ends[-2] -= 1
    return list(zip([0] + ends[:-1], ends))


def read_quantization(engine: LlamaCppEngine) -> str:
    """The file type ("Q4_1", "Q4_K_M"), from the loaded model's own metadata: reading it with gguf's
    GGUFReader mapped the whole file and kept its pages and tensor tables resident after (bench/resident_memory.py)."""
    import gguf  # only for the names of the file types

    buf = ctypes.create_string_buffer(32)
    if lc.llama_model_meta_val_str(engine.model, b"general.file_type", buf, len(buf)) < 0:
        return "unknown"
    try:
        return gguf.LlamaFileType(int(buf.value)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return "unknown"


def _kv_shape(gguf_path: str) -> tuple[int, int, int]:
    """(layers, KV heads, head width) from the GGUF's metadata (a vocab-only load: no weights read, and no
    per-layer shapes either: llama_model_n_head aborts on such a model, so the keys are read as written)."""
    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(gguf_path.encode(), params)
    if not model:
        raise EngineFailure(f"llama.cpp could not read {gguf_path}")
    try:
        return kv_shape_of(model)
    finally:
        lc.llama_model_free(model)


def kv_shape_of(model) -> tuple[int, int, int]:
    """(layers, KV heads, head width) of a loaded model, from its metadata keys (ValueError: a key written per
    layer, an array)."""
    arch = _meta(model, "general.architecture")
    heads = int(_meta(model, f"{arch}.attention.head_count") or 1)
    kv_heads = int(_meta(model, f"{arch}.attention.head_count_kv") or heads)
    width = _meta(model, f"{arch}.attention.key_length") or int(_meta(model, f"{arch}.embedding_length")) // heads
    return int(_meta(model, f"{arch}.block_count")), kv_heads, int(width)


def _meta(model, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    return buf.value.decode() if lc.llama_model_meta_val_str(model, key.encode(), buf, len(buf)) >= 0 else ""


def thread_count(threads: int) -> int:
    """The threads a context runs: `threads`, or 0 for every core this process may run on."""
    import os

    if threads:
        return threads
    return max(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 1)
