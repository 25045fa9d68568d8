"""The token fence: a per-request llguidance matcher that masks logits so only grammar-valid tokens are sampled.

    compiler = FenceCompiler(tokenizer, vocab_size=151936, stop_token_ids=frozenset({151645, 151643}))
    markup = compiler.markup_tokens(dialect)          # once per (model, dialect): <tool_call> → <[151657]>
    fence = compiler.compile(dialect.fence_grammar(spec, markup))   # per request; cached by grammar text
    loop:  token = sample_fenced(sampler, logits, fence)   # or fence.apply(logits) then sample
           fence.advance(token.item())   # the matcher consumes it (EOS included, which stops the fence)

Speculative decoding: `fence.valid_prefix(draft)` cuts a draft before a forbidden token (no mask computed), then
`masks = fence.draft_masks(draft)` gives the mask before each token verified, on a probe
clone (the real state does not move); the engine loop then feeds the accepted tokens through `fence.advance` one
by one, as it does every token. Batched rows share a forward and are sampled one by one, each within its own
fence.

Compiling a grammar costs far more than copying one, so it is cached: a fresh template matcher per grammar
text is kept in a small LRU and each request gets a `deep_copy` of it, which also shares the template's lexer
warm-up. Per token, computing, applying and advancing the mask is a small share of a CPU decode step
(bench/fence.py), so the mask is computed inline rather than on a worker thread overlapping the forward pass
(llguidance releases the GIL, so that remains an option where a step is much shorter, e.g. on a GPU).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

import llguidance
import numpy as np

from zllm.dialects.base import Dialect, FenceGrammar, MarkupTokens
from zllm.engine.sampler import Sampler
from zllm.errors import EngineFailure, InvalidRequest
from zllm.runtime.fence_mask import any_set_except, bit_is_set, count_set, mask_logits
from zllm.runtime.fence_vocab import FenceVocab

log = logging.getLogger("zllm.runtime.fence")

DEFAULT_CACHE_SIZE = 32
_LIMITS = llguidance.LLParserLimits(verbose_errors=False)


class FenceViolation(EngineFailure):
    """The fence was asked to consume a token it does not allow (a runtime bug: sampling skipped the mask),
    or llguidance hit an internal limit while computing a mask."""


class FenceCompiler:
    """One per loaded model: the llguidance view of its tokenizer, plus a cache of compiled grammars.

    `vocab_size` is the logits width (may exceed the tokenizer: padded embedding rows are always masked);
    `stop_token_ids` are the model's end tokens, which llguidance allows exactly where the grammar may end.
    Thread-safe: requests may be compiled on any thread.
    """

    def __init__(self, tokenizer, *, vocab_size: int, stop_token_ids: frozenset[int],
                 cache_size: int = DEFAULT_CACHE_SIZE):
        self.vocab = FenceVocab.build(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._templates: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def markup_tokens(self, dialect: type[Dialect] | Dialect) -> MarkupTokens:
        return self.vocab.markup_tokens(dialect)

    @property
    def cached_grammars(self) -> int:
        return len(self._templates)

    def compile(self, grammar: FenceGrammar) -> Fence:
        """A fresh fence for one request. Raises InvalidRequest when llguidance rejects the grammar (a
        user-supplied schema it cannot compile), ConfigError when the grammar's literals cannot be produced."""
        return Fence(self._template(grammar).deep_copy(), self.vocab)

    def _template(self, grammar: FenceGrammar) -> llguidance.LLMatcher:
        key = grammar.lark
        with self._lock:
            template = self._templates.get(key)
            if template is not None:
                self._templates.move_to_end(key)
                return template
        self.vocab.check_grammar(grammar)
        template = _new_matcher(self.vocab, grammar.lark)  # outside the lock: it may take tens of ms
        with self._lock:
            self._templates[key] = template
            while len(self._templates) > self._cache_size:
                self._templates.popitem(last=False)
        return template


def _new_matcher(vocab: FenceVocab, lark: str) -> llguidance.LLMatcher:
    # verbose errors dump the parser state and the whole grammar (every tool schema) into the message
    matcher = llguidance.LLMatcher(vocab.ll_tokenizer, lark, log_level=0, limits=_LIMITS)
    if matcher.is_error():
        error = matcher.get_error()
        log.debug("fence grammar rejected: %s", error)
        raise InvalidRequest(f"the output constraint cannot be compiled: {_first_line(error)}",
                             hint="check the tool or response JSON Schema for unsupported keywords")
    for warning in matcher.get_grammar_warnings():
        log.debug("fence grammar warning: %s", warning)
    return matcher


def _first_line(error: str, limit: int = 300) -> str:
    """llguidance's message without the grammar excerpt it appends (positions in generated text)."""
    line = error.strip().splitlines()[0] if error.strip() else "unknown error"
    line = re.sub(r"^at \d+\(\d+\): ", "", line)
    return line if len(line) <= limit else line[:limit] + "…"


class Fence:
    """One request's (or one batch row's) grammar state. Not thread-safe: the engine thread owns it.

    The mask for the current state is computed once, on first use (apply / allowed / ...), and reused until
    the state moves (advance)."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab: FenceVocab):
        self._matcher = matcher
        self._vocab = vocab
        self._words = np.empty(vocab.mask_words, dtype=np.int32)  # [mask_words], llguidance layout
        self._fresh = False  # whether _words describes the current state

    # ------------------------------------------------------------------ masking

    def apply(self, logits) -> None:
        """logits: [vocab] (numpy, or torch on any device); tokens the grammar forbids here become -inf, in place."""
        mask_logits(logits, self.mask())

    def mask(self) -> np.ndarray:
        """The current state's bitmask, [mask_words] int32 (valid until the state moves)."""
        if not self._fresh:
            self._compute_mask()
            self._fresh = True
        return self._words

    def allowed(self, token_id: int) -> bool:
        return bit_is_set(self.mask(), token_id)

    def allowed_count(self) -> int:
        return count_set(self.mask())

    def allows_other_than(self, token_id: int) -> bool:
        """Whether banning `token_id` still leaves something to sample (the loop guard asks before banning)."""
        return any_set_except(self.mask(), token_id)

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces from here regardless of the model (may be empty): a runtime may feed
        them without sampling, or a speculative decoder may use them as a free draft."""
        return self._matcher.compute_ff_tokens()

    # ------------------------------------------------------------------ state

    def advance(self, token_id: int) -> None:
        if not self._matcher.consume_token(token_id):
            raise FenceViolation(f"the fence does not allow token {token_id}: {self._matcher.get_error()}")
        self._fresh = False

    def clone(self) -> Fence:
        twin = Fence(self._matcher.deep_copy(), self._vocab)
        if self._fresh:
            twin._words[:] = self._words
            twin._fresh = True
        return twin

    def is_accepting(self) -> bool:
        """Whether the output may end here (the model's stop tokens are allowed)."""
        return self._matcher.is_accepting()

    def is_stopped(self) -> bool:
        """Whether nothing but a stop token can follow (the grammar is complete, or a stop token was taken)."""
        return self._matcher.is_stopped()

    # ------------------------------------------------------------------ speculative decoding

    def valid_prefix(self, draft: Sequence[int]) -> int:
        """How many leading draft tokens the grammar allows from here, without computing a mask (this fence does
        not move): a draft is cut there before anything masks it."""
        return self._matcher.validate_tokens(list(draft))

    def draft_masks(self, draft: Sequence[int]) -> np.ndarray:
        """The mask before each draft token, on a probe (this fence does not move).

        Returns `[j, mask_words]` int32 where j is how many leading draft tokens the grammar allows: row i masks
        the target logits at draft position i. A draft token past j is grammar-invalid, so the verifier rejects
        it (and everything after it) without looking at its logits. No mask after the last token: the next
        step's fence computes it when it needs it."""
        probe = self.clone()
        rows = []
        for token_id in draft:
            rows.append(probe.mask().copy())
            if not probe.allowed(token_id):
                rows.pop()
                break
            probe.advance(token_id)
        return np.stack(rows) if rows else np.zeros((0, self._vocab.mask_words), dtype=np.int32)

    # ------------------------------------------------------------------ internals

    def _compute_mask(self) -> None:
        # llguidance writes the mask straight into our buffer, the GIL released meanwhile
        self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        if self._matcher.is_error():  # e.g. a lexer/parser limit hit on a pathological schema
            raise FenceViolation(f"the fence failed: {self._matcher.get_error()}")
        # padded embedding rows and ids a grammar could name but the logits lack never pass
        np.bitwise_and(self._words, self._vocab.valid_words, out=self._words)


def sample_fenced(sampler: Sampler, logits, fence: Fence | None):
    """Sample one token within the fence. logits: [vocab] (the loop guard's ban already applied) → [1, 1].

    Greedy and plain-temperature sampling sample first and keep the token when the fence allows it, so the
    mask is applied only when the model strays (most steps of a model that follows the format skip it).
    That is exact: argmax over all that lands in the allowed set A is the argmax over A, and for sampling,
    P(x) = p(x) + (1 − p(A))·p(x)/p(A) = p(x)/p(A) for x in A, the masked distribution. With top-k or top-p
    the candidate set depends on the mask, so those mask first."""
    if fence is None:
        return sampler(logits)
    config = sampler.config
    if config.greedy or (config.top_k == 0 and config.top_p >= 1.0):
        token = sampler(logits)
        if fence.allowed(token.item()):  # the engine loop's one host sync per token, taken early
            return token
    fence.apply(logits)
    return sampler(logits)

