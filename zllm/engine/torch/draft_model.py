"""A small causal LM as the speculative drafter: greedy drafts from a draft model that shares the target's
vocabulary, verified by the target like prompt-lookup drafts (runtime/speculative.py).

A greedy drafter is deterministic, so the verifier's rules stay exact: greedy output equals the plain loop's,
sampled output is distributed as p (engine/verify.py). The draft model only decides how many tokens a verify
forward gets right.

One `DraftModel` is loaded per daemon; each request gets its own `DraftModelDrafter` with its own draft KV
cache. The drafter speaks PromptLookup's interface (extend / propose / __len__), and keeps its cache in step
with the sequence incrementally:

    sequence (real)     p p p p p o o           prompt + emitted tokens, as extend() gave them
    draft cache         p p p p p o o t t d d   after propose(): + the tail and the fed draft tokens
    extend([t, t, d])   p p p p p o o t t d     the fed tokens that turned real are kept, the rest cropped

so the tokens a verify accepts were usually computed by the propose before it, and each propose feeds only
what the cache has not seen. The prompt is prefilled at the first propose, not at admission (a request that
never drafts never pays for it), in the runner's chunks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase

from zllm.token_prefix import common_prefix_length
from zllm.engine.torch.backend import TorchModel
from zllm.engine.torch.kv_layers import crop_to, croppable, supports_working_buffers, working_cache
from zllm.engine.torch.loader import load_model
from zllm.engine.torch.runner import DEFAULT_PREFILL_CHUNK, ModelRunner
from zllm.errors import ConfigError

# prompt tokens a draft model sees (the most recent ones; see DraftModel.drafter_for)
DRAFT_PROMPT_WINDOW = 1024
# tokens of room a new draft cache reserves past the prompt (its buffers then double as the request grows)
DECODE_HEADROOM = 256
_HINT = "use a draft model of the same family as the served model (one that ships the same tokenizer)"


@dataclass(frozen=True, eq=False)
class DraftModel:
    """The loaded draft model, shared by every request's drafter (engine thread only)."""

    runner: ModelRunner
    # draft ids below this are the target's tokens: only they are proposed (a draft row past the target's
    # vocabulary, e.g. padding, would index outside the target's logits)
    proposable: int
    # ids the draft model can embed: a sequence holding another id (a target padding id, sampled) is not drafted for
    embeddable: int
    # the draft model's own context window: a drafter stops drafting past it rather than draft from garbage
    context_length: int
    # per layer, a one-token (keys, values) pair the draft's cache buffers are shaped after; None: the model's
    # cache layers cannot be preallocated (kv_layers.supports_working_buffers) and drafters use DynamicCache
    kv_probe: tuple[tuple[torch.Tensor, ...], ...] | None = field(default=None, repr=False)
    path: Path | None = None

    @classmethod
    def for_target(cls, loaded: TorchModel, target_tokenizer: PreTrainedTokenizerBase, *,
                   prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> DraftModel:
        """Check that `loaded` can draft for a model with `target_tokenizer` (ConfigError if not)."""
        # a drafter runs one sequence at a time: no packing probe (forwards at startup, attention switched)
        runner = ModelRunner(loaded.model, prefill_chunk=prefill_chunk, packing=False)
        embeddable = embedding_rows(loaded)
        proposable = check_shared_vocabulary(target_tokenizer, loaded.tokenizer, embeddable)
        if not croppable(runner.new_cache()):
            raise ConfigError(f"the draft model {loaded.path} has sliding-window or linear-attention layers, whose "
                              "cache cannot take rejected drafts back", hint="use a full-attention draft model")
        with torch.inference_mode():  # probed once here: each request's cache is then built without a forward
            kv_probe = runner.probe_kv_state() if supports_working_buffers(runner.config) else None
        return cls(runner, proposable, embeddable, loaded.context_length, kv_probe, loaded.path)

    def drafter_for(self, prompt_ids: Sequence[int]) -> DraftModelDrafter:
        """A fresh drafter for one request (its cache is built at its first propose). It sees only the prompt's
        last DRAFT_PROMPT_WINDOW tokens: the draft's KV is not in the prefix cache, and prefilling a 30K-token
        agent prompt on the draft model every turn would cost more than speculation saves. A shorter context
        only lowers how often drafts are right; the target verifies every one."""
        return DraftModelDrafter(self, prompt_ids[-DRAFT_PROMPT_WINDOW:])


def load_draft_model(path: str | Path, target_tokenizer: PreTrainedTokenizerBase, *, device: str = "auto",
                     dtype: str = "auto", threads: int = 0) -> DraftModel:
    """Load the model directory `path` as a drafter for a target using `target_tokenizer`. Pass the target's
    device, dtype and threads: the draft runs on the engine thread, between the target's forwards."""
    return DraftModel.for_target(load_model(path, device=device, dtype=dtype, threads=threads), target_tokenizer)


def embedding_rows(loaded: TorchModel) -> int:
    return loaded.model.get_input_embeddings().num_embeddings


def check_shared_vocabulary(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase,
                            draft_rows: int) -> int:
    """Every token of the target must have the same id in the draft (drafts and the sequence travel between
    the models as ids), and the draft must embed every target id. Returns how many ids the draft may
    propose: the target tokenizer's (the highest target id + 1)."""
    target_vocab, draft_vocab = target.get_vocab(), draft.get_vocab()
    mismatched = [token for token, token_id in target_vocab.items() if draft_vocab.get(token) != token_id]
    if mismatched:
        examples = ", ".join(repr(token) for token in sorted(mismatched)[:3])
        raise ConfigError(f"the draft model's tokenizer differs from the served model's: {len(mismatched)} of "
                          f"{len(target_vocab)} tokens are missing or have other ids (e.g. {examples})", hint=_HINT)
    proposable = max(target_vocab.values()) + 1
    if proposable > draft_rows:
        raise ConfigError(f"the draft model embeds {draft_rows} token ids, the served model's tokenizer uses "
                          f"{proposable}", hint=_HINT)
    return proposable


@dataclass(eq=False)
class DraftModelDrafter:
    """Greedy drafts from the draft model over prompt + output. Engine thread only, under inference mode."""

    model: DraftModel
    prompt_ids: Sequence[int] = field(repr=False)
    forwards: int = field(init=False, default=0)  # draft forwards run (prefill chunks count as one each)
    _sequence: list[int] = field(init=False, repr=False)  # prompt + emitted tokens: the real sequence
    _cache: DynamicCache | None = field(init=False, default=None)  # built at the first propose
    _real: int = field(init=False, default=0)  # leading sequence tokens the cache holds
    # tokens the cache holds after those `_real`: the last propose's tail and fed drafts, not real (yet). Kept
    # until extend() says which of them the verifier accepted; `_real + len(_pending)` = cache length
    _pending: list[int] = field(init=False, default_factory=list)
    # a sequence id the draft model cannot embed (a target padding id, sampled): no more drafts for this request
    _blind: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._sequence = []
        self.extend(self.prompt_ids)

    def __len__(self) -> int:
        return len(self._sequence)

    @property
    def cache_length(self) -> int:
        """Tokens the draft cache holds: the first `cached_real` of the sequence, then the pending ones."""
        return self._real + len(self._pending)

    @property
    def cached_real(self) -> int:
        return self._real

    @property
    def cache(self) -> DynamicCache | None:
        """The draft KV cache (None before the first propose)."""
        return self._cache

    def extend(self, tokens: Iterable[int]) -> None:
        new = list(tokens)
        if self._pending:
            # the cache already ran the previous tail and draft: keep the part of it that turned real
            assert self._real == len(self._sequence), "pending tokens follow the whole sequence"
            self._real += common_prefix_length(self._pending, new)
            self._pending.clear()
            crop_to(self._cache, self._real)
        self._blind = self._blind or (bool(new) and max(new) >= self.model.embeddable)
        self._sequence.extend(new)

    def propose(self, limit: int, tail: Sequence[int] = ()) -> list[int]:
        """Up to `limit` greedy tokens of the draft model after sequence + `tail` (tokens chosen this step, not
        in the sequence yet). Empty when the draft model cannot see that far (its context window)."""
        wanted = len(self._sequence) + len(tail)
        limit = min(limit, self.model.context_length - wanted)
        if limit <= 0 or self._blind or not wanted:
            return []
        cache = self._cache if self._cache is not None else self._new_cache()
        logits = self._catch_up(tail, cache)
        draft = self._decode(logits, limit, cache)
        self._pending.extend(draft[:-1])  # the last draft token is proposed, never fed
        return draft

    def _catch_up(self, tail: Sequence[int], cache: DynamicCache) -> torch.Tensor:
        """Make the cache hold sequence + tail, feeding only what it lacks; the logits after the last token."""
        unseen = [*self._sequence[self._real:], *tail]  # what follows the real tokens the cache holds
        kept = self._real + common_prefix_length(self._pending, unseen)  # pending tokens that continue it as they did
        if kept == self._real + len(unseen):  # all of it was fed before: the last token again, for its logits
            kept -= 1
        crop_to(cache, kept)
        logits = self._feed(unseen[kept - self._real:] if kept >= self._real else self._sequence[kept:], cache)
        self._real, self._pending = len(self._sequence), list(tail)
        return logits

    def _new_cache(self) -> DynamicCache:
        runner, probe = self.model.runner, self.model.kv_probe
        if probe is None:
            self._cache = runner.new_cache()
            return self._cache
        # preallocated layers: a DynamicLayer copies itself on every append (torch.cat), which k draft decode
        # steps over a long prompt would pay k times per step
        capacity = len(self._sequence) + DECODE_HEADROOM
        buffers = tuple(tuple(t.new_empty(*t.shape[:-2], capacity, t.shape[-1]) for t in layer) for layer in probe)
        self._cache = working_cache(runner.config, buffers, 0)
        return self._cache

    def _feed(self, tokens: list[int], cache: DynamicCache) -> torch.Tensor:
        runner = self.model.runner
        self.forwards += -(-len(tokens) // runner.prefill_chunk)
        return runner.prefill(tokens, cache)

    def _decode(self, logits: torch.Tensor, limit: int, cache: DynamicCache) -> list[int]:
        """Greedy: `limit` tokens, each fed back but the last. Tokens stay on the device until the end (one host
        sync per propose, not per token)."""
        tokens = []
        for position in range(limit):
            token = logits[:self.model.proposable].argmax().view(1, 1)  # [1, 1]
            tokens.append(token)
            if position + 1 < limit:
                logits = self.model.runner.decode(token, cache)
                self.forwards += 1
        return torch.cat(tokens, dim=1)[0].tolist()

