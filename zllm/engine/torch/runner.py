"""Forward passes over a caller-owned KV cache: prefill a prompt (or append to a kept cache), decode one token,
verify a speculative draft (logits at every fed position).

The cache is a `transformers.DynamicCache` the runtime creates per request and passes in, so it can later be
kept, cropped, saved and restored by the prefix cache. Positions continue from the cache's length, which is
why an append-prefill on a kept cache gives the same logits as a full prefill.

Every method must run under `torch.inference_mode()` (the engine thread enters it once for its whole life;
entering it per step would cost a few microseconds per token for nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch
from transformers import DynamicCache, PreTrainedModel

from zllm.engine.contract import UNBOUNDED_ROWS, KeptState, Row
from zllm.engine.torch.kv_layers import cache_buffers, cache_state, crop_to, croppable, working_cache
from zllm.engine.torch.packed import Segment, packed_forward, supports_packing, use_packed_attention


def apply_threads(threads: int) -> None:
    """torch's intra-op thread count; call it on every thread that runs torch work (it is per thread for OpenMP)."""
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


# Long prompts are prefilled in chunks: bounds activation memory (the MLP of a 30K-token forward is GBs) and
# gives the caller a point between chunks to notice an abort.
DEFAULT_PREFILL_CHUNK = 2048


class ModelRunner:
    """The torch backend of the engine seam (engine/contract.py). Runs `model` forward for one sequence, or for
    several rows packed into one forward (`forward_rows`). Owns no per-request state.

    `packing` None: probe the model (engine/torch/packed.py) and pack when packed forwards equal separate ones;
    a model that cannot be packed still serves several rows, one forward per row."""

    def __init__(self, model: PreTrainedModel, *, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 packing: bool | None = None):
        assert prefill_chunk > 0
        self.model = model
        self.config = model.config
        self.device = model.device
        self.prefill_chunk = prefill_chunk
        self.packing = self._enable_packing() if packing is not False else False

    backend = "torch"
    step_rows = 1
    verify_rows = UNBOUNDED_ROWS  # no bound of its own (a draft is capped by SpeculationConfig.max_draft)
    verify_row_cost = None  # not measured: prompt lookup drafts without the cost gate (backoff only)

    # ------------------------------------------------------------------ the engine seam (contract.py)

    @staticmethod
    @contextmanager
    def engine_thread(threads: int):
        """torch's intra-op thread count is per OS thread, and every forward runs under inference mode (entered
        once for the thread's life: per step it would cost microseconds per token for nothing)."""
        apply_threads(threads)
        with torch.inference_mode():
            yield

    def open(self, lease=None) -> DynamicCache:
        """A sequence: empty, or a working cache over the lease's pooled buffers holding its restored prefix
        (prefill and decode then append in place)."""
        if lease is None:
            return self.new_cache()
        return working_cache(self.config, lease.kv, lease.cached_tokens)  # pooled buffers (cache/kv.py)

    def step(self, rows: Sequence[Row]) -> list[torch.Tensor]:
        return self.forward_rows([Segment(row.seq, row.token_ids, row.all_logits) for row in rows])

    @staticmethod
    def length(seq: DynamicCache) -> int:
        return seq.get_seq_length()

    @staticmethod
    def can_crop(seq: DynamicCache) -> bool:
        return croppable(seq)

    @staticmethod
    def crop(seq: DynamicCache, length: int) -> None:
        crop_to(seq, length)

    @staticmethod
    def release(seq: DynamicCache) -> None:
        """Nothing to do: the cache's buffers go back with the lease (or to the garbage collector)."""

    @staticmethod
    def kept_state(seq: DynamicCache) -> KeptState:
        return KeptState(cache_state(seq), cache_buffers(seq))

    # ------------------------------------------------------------------ forwards

    def _enable_packing(self) -> bool:
        previous = self.model.config._attn_implementation
        try:
            use_packed_attention(self.model)
        except (ValueError, ImportError):  # a model that does not take the attention interface
            return False
        with torch.inference_mode():
            if supports_packing(self.model, self.new_cache):
                return True
        self.model.set_attn_implementation(previous)
        return False

    def forward_rows(self, segments: Sequence[Segment]) -> list[torch.Tensor]:
        """Feed each segment's tokens to its own cache; per segment, the logits after its last token (`[vocab]`)
        or after each token for `all_logits` segments (`[n, vocab]`). One forward when the model packs."""
        if self.packing:
            return packed_forward(self.model, segments)
        return [self.verify(segment.token_ids, segment.cache) if segment.all_logits
                else self._forward(self.as_input(segment.token_ids), segment.cache) for segment in segments]

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def probe_kv_state(self) -> tuple[tuple[torch.Tensor, ...], ...]:
        """The KV state one token leaves, per layer: shapes and dtypes of what a cache holds for this model
        (`[1, kv_heads, 1, head_dim]` per tensor for standard attention). Call under inference mode."""
        cache = self.new_cache()
        self._forward(self.as_input([0]), cache)
        return tuple((layer.keys, layer.values) for layer in cache.layers)

    def as_input(self, token_ids: Sequence[int]) -> torch.Tensor:
        # [1, n] on the model's device
        return torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)

    def prefill(
        self,
        token_ids: Sequence[int] | torch.Tensor,
        cache: DynamicCache,
        *,
        should_stop: Callable[[], bool] | None = None,
    ) -> torch.Tensor | None:
        """Append `token_ids` to `cache`; return the logits after the last one, `[vocab]`.

        Works on an empty cache (new prefill) and on a kept one (append prefill). Returns None when
        `should_stop()` turned true between chunks (the cache then holds a prefix of the tokens).
        """
        ids = token_ids if isinstance(token_ids, torch.Tensor) else self.as_input(token_ids)  # [1, n]
        assert ids.dim() == 2 and ids.shape[0] == 1 and ids.shape[1] > 0, "prefill needs [1, n>0] token ids"
        logits = None
        for start in range(0, ids.shape[1], self.prefill_chunk):
            if should_stop is not None and should_stop():
                return None
            logits = self._forward(ids[:, start:start + self.prefill_chunk], cache)
        return logits

    def decode(self, token: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """One decode step. token: [1, 1] long on the device; returns the next logits, `[vocab]`."""
        return self._forward(token, cache)

    def verify(self, token_ids: Sequence[int], cache: DynamicCache) -> torch.Tensor:
        """Append `token_ids` (a sampled token, then a speculative draft) in one forward and return the logits
        after each of them, `[n, vocab]`: row i is the distribution for the token after token_ids[i]. The
        caller crops the cache back past the draft tokens it rejects (kv_layers.crop_to)."""
        ids = self.as_input(token_ids)  # [1, n]
        out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=ids.shape[1])
        return out.logits[0]  # [n, vocab]

    def _forward(self, ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        # logits_to_keep=1: only the last position goes through lm_head (vocab can be 150K wide)
        out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]  # [vocab]
