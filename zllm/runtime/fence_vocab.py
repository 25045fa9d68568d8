"""What the fence must know about one model's vocabulary, and the checks that refuse an unsatisfiable fence.

Built once per loaded model (`FenceVocab.build`: llguidance walks every token, twice — see `_ll_tokenizer` —
which takes a while).

Added tokens are the trap. llguidance treats every added token (`<tool_call>` = 151657 in Qwen) as special: a
grammar names it `<[151657]>`; a *quoted* literal matches text bytes only, spelled with ordinary tokens
("<", "tool", "_call", ">": not what the model writes). Worse, where such a literal's bytes are forced,

    start: "<tool_call>" ...        (Qwen: the mask offers token 151657, consuming it errors the matcher)

the mask allows a token the matcher then rejects. So before a fence starts, every quoted string of
the grammar (outside `%json {...}` schemas, whose strings are JSON values, not markup) is scanned for added
token texts, and every literal the dialect relies on is checked to be either exactly one added token or text
that ordinary tokens can spell.

Logits can be wider than the tokenizer (padded embedding rows: Qwen's 151936 logits over 151669 tokens);
`valid_words` is the bitmask of ids that exist, and every fence mask is ANDed with it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import llguidance
import numpy as np

from zllm.dialects.base import Dialect, FenceGrammar, MarkupTokens
from zllm.dialects.registry import TokenizerFacts, choose_dialect
from zllm.errors import ConfigError

UNSATISFIABLE = "refuses to enable a fence it cannot satisfy"


@dataclass(frozen=True, eq=False)
class FenceVocab:
    """llguidance's view of one tokenizer, the added tokens it treats as special, and the valid-id mask."""

    tokenizer: object  # the Hugging Face tokenizer (for counting how a literal splits)
    ll_tokenizer: llguidance.LLTokenizer
    vocab_size: int  # logits width
    # added tokens llguidance treats as special: their text → id (a quoted literal can never produce them)
    special_ids: Mapping[str, int]
    # [mask_words] int32: bit i set ⇔ token i exists in the tokenizer and fits in the logits
    valid_words: np.ndarray
    _special_pattern: re.Pattern | None

    @property
    def mask_words(self) -> int:
        """Length of one llguidance bitmask, in int32 words (it covers llguidance's vocabulary)."""
        return len(self.valid_words)

    @classmethod
    def build(cls, tokenizer, *, vocab_size: int, stop_token_ids: frozenset[int]) -> FenceVocab:
        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError("constrained decoding needs a fast (Rust) tokenizer",
                              hint="the model directory needs a tokenizer.json")
        ids = _token_ids(tokenizer)
        n_vocab = max(vocab_size, max(ids) + 1)
        if outside := sorted(i for i in stop_token_ids if not 0 <= i < n_vocab):
            raise ConfigError(f"stop token ids {outside} are outside the vocabulary ({n_vocab} ids)")
        eos = sorted(stop_token_ids) or tokenizer.eos_token_id
        try:
            ll_tokenizer = _ll_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=eos)
        except ValueError as exc:
            raise ConfigError(f"llguidance cannot use this tokenizer: {exc}") from exc
        added = tokenizer.get_added_vocab()
        special = {text: token_id for text, token_id in added.items() if ll_tokenizer.is_special_token(token_id)}
        return cls(
            tokenizer=tokenizer,
            ll_tokenizer=ll_tokenizer,
            vocab_size=vocab_size,
            special_ids=special,
            valid_words=_valid_words(ids, vocab_size, n_vocab),
            _special_pattern=_alternation(special),
        )

    # ------------------------------------------------------------------ markup

    def markup_tokens(self, dialect: type[Dialect] | Dialect) -> MarkupTokens:
        """Which of `dialect.markup` this tokenizer has as one added token. Raises ConfigError when a
        `single_token_markup` literal is split, or a literal mixes an added token with text."""
        # every added token, special to llguidance or not (DeepSeek V4's `｜DSML｜` is not): named by id, the
        # grammar forces the one token the dialect's prompts use, so the output re-renders token for token
        added = self.tokenizer.get_added_vocab()
        single = {literal: added[literal] for literal in dialect.markup if literal in added}
        for literal in dialect.single_token_markup:
            if literal not in single:
                pieces = len(self.tokenizer.encode(literal, add_special_tokens=False))
                raise ConfigError(
                    f"dialect {dialect.name} needs {literal!r} as one token, "
                    f"this tokenizer splits it into {pieces}",
                    hint=self._dialect_hint(dialect.name),
                )
        for literal in dialect.markup:
            if literal not in single:
                self._check_text_literal(literal, f"dialect {dialect.name}")
        return MarkupTokens(single=single)

    def _dialect_hint(self, refused: str) -> str:
        """Name the dialect the registry would pick for this tokenizer (`deepseek-v3.2` for a V3 vocabulary)."""
        template = getattr(self.tokenizer, "chat_template", None)
        added = frozenset(self.tokenizer.get_added_vocab())
        choice = choose_dialect(TokenizerFacts(added, template if isinstance(template, str) else None))
        if choice.name == refused:
            return "this dialect does not fit this model's tokenizer"
        return f"choose dialect {choice.name} ({choice.reason}), or `auto`"

    # ------------------------------------------------------------------ grammars

    def check_grammar(self, grammar: FenceGrammar) -> None:
        """Raise ConfigError unless every literal the grammar relies on can be produced token by token."""
        for literal in grammar.literals:
            if literal not in self.special_ids:
                self._check_text_literal(literal, "the grammar")
        for quoted in lark_quoted_strings(grammar.lark):
            if (found := self._special_in(quoted)) is not None:
                raise ConfigError(
                    f"the fence grammar quotes {quoted!r} as text, but this tokenizer has {found!r} only as "
                    f"the added token {self.special_ids[found]}: zllm {UNSATISFIABLE}",
                    hint=f"write it as <[{self.special_ids[found]}]> (MarkupTokens.lark does)",
                )

    def _check_text_literal(self, literal: str, owner: str) -> None:
        found = self._special_in(literal)
        if found is not None:
            raise ConfigError(
                f"{owner} writes {literal!r} as text, but this tokenizer reads {found!r} in it as the added "
                f"token {self.special_ids[found]}: zllm {UNSATISFIABLE}",
                hint="split the literal so the added token stands alone (MarkupTokens.lark spells it)",
            )
        if not self._spellable(literal):
            raise ConfigError(
                f"{owner} needs the text {literal!r}, which this tokenizer cannot spell with ordinary tokens: "
                f"zllm {UNSATISFIABLE}",
                hint="this dialect does not fit this model's tokenizer",
            )

    def _special_in(self, text: str) -> str | None:
        if self._special_pattern is None:
            return None
        match = self._special_pattern.search(text)
        return match.group(0) if match else None

    def _spellable(self, text: str) -> bool:
        tokens = self.ll_tokenizer.greedy_tokenize(text)
        if any(self.ll_tokenizer.is_special_token(token) for token in tokens):
            return False
        return self.ll_tokenizer.decode_bytes(tokens) == text.encode()


# llguidance's token-mask "slices" (token subsets precomputed for common lexemes) cost resident memory in
# proportion to the vocabulary. The one for JSON string contents alone keeps the mask as fast over a tool
# call's JSON as all four general ones, at a quarter of their memory (figures: README, "Where the time goes").
MASK_SLICES = [r'[^"\\\x00-\x1F\x7F]+']
# fragments whose tokens a tokenizer must give as llguidance does, mid-text: a SentencePiece tokenizer that
# prepends "▁" to what it encodes does not (llguidance's JSON loader switches that off in its own copy)
_FRAGMENTS = ("hello", "x = 1", " indented", "\n\tdef f():", "déjà 日本")


def _ll_tokenizer(tokenizer, *, n_vocab: int, eos_token) -> llguidance.LLTokenizer:
    """llguidance's tokenizer over the token bytes, tokenizing through zllm's own Rust tokenizer.

    Built from the tokenizer's JSON, llguidance keeps a second copy of the Rust tokenizer for its whole life
    (what that costs: bench/resident_memory.py). So a first, slice-less LLTokenizer is
    built from the JSON to read each token's bytes and specialness (llguidance's own byte-level and
    byte-fallback decoding, not a copy of it here); the one kept is built from those bytes and calls back
    into `tokenizer` to tokenize. Where that tokenizer splits a fragment otherwise than llguidance's copy (a
    prepended "▁"), the JSON-built one is kept, with the slices. A test compares both on the suite's
    tokenizers."""
    probe = llguidance.LLTokenizer(_tokenizer_json(tokenizer), n_vocab=n_vocab, eos_token=eos_token, slices=[])
    view = _TokenBytes(tokenizer, [probe.decode_bytes([i]) for i in range(n_vocab)],
                       [i for i in range(n_vocab) if probe.is_special_token(i)])
    backend = tokenizer.backend_tokenizer
    if backend.padding is not None or backend.truncation is not None or not view.splits_like(probe):
        return probe.with_slices(MASK_SLICES)  # (a padding / truncating tokenizer would pad the callback's ids)
    del probe
    wrapper = llguidance.TokenizerWrapper(view)
    ll_tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=n_vocab, eos_token=eos_token, slices=MASK_SLICES)
    wrapper.tokens = view.tokens = []  # copied into llguidance's trie; it keeps the wrapper for the callback
    return ll_tokenizer


class _TokenBytes:
    """What `llguidance.TokenizerWrapper` reads of a tokenizer: every token's bytes, the special ids, and a
    call that tokenizes text (no special-token parsing: llguidance asks for text it will match as bytes)."""

    def __init__(self, tokenizer, tokens: list[bytes], special_token_ids: list[int]):
        self.tokens, self.special_token_ids = tokens, special_token_ids
        self.eos_token_id, self.bos_token_id = tokenizer.eos_token_id, tokenizer.bos_token_id
        self._encode = tokenizer.backend_tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text, add_special_tokens=False).ids

    def splits_like(self, ll_tokenizer: llguidance.LLTokenizer) -> bool:
        return all(self(text) == ll_tokenizer.tokenize_str(text) for text in _FRAGMENTS)


def _tokenizer_json(tokenizer) -> str:
    """The Rust tokenizer serialized for llguidance, with its added tokens, padding and truncation off — what
    `llguidance.hf.from_tokenizer` hands it, without that module's import of transformers (which imports torch:
    the llama.cpp path serves on `tokenizers` alone, prompt/tokenizer_files.py)."""
    backend = tokenizer.backend_tokenizer
    if backend.padding is None and backend.truncation is None:  # the usual case: no clone (a whole vocabulary)
        return backend.to_str()
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return backend.to_str()


def _token_ids(tokenizer) -> list[int]:
    return list(tokenizer.get_vocab().values())  # base vocabulary and added tokens


def _valid_words(ids: list[int], vocab_size: int, n_vocab: int) -> np.ndarray:
    """Bitmask (llguidance layout: bit i of word i // 32, little-endian) of ids below vocab_size that exist."""
    words = (n_vocab + 31) // 32
    bits = np.zeros(words * 32, dtype=np.uint8)
    ids_array = np.asarray(ids, dtype=np.int64)
    bits[ids_array[ids_array < vocab_size]] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)


def _alternation(texts: Mapping[str, int]) -> re.Pattern | None:
    if not texts:
        return None
    # longest first: report `<|im_end|>` rather than a shorter added token inside it
    return re.compile("|".join(re.escape(text) for text in sorted(texts, key=len, reverse=True)))


# ---------------------------------------------------------------------------------------------- Lark scan


def lark_quoted_strings(lark: str) -> Iterator[str]:
    """The double-quoted string literals of a Lark grammar, decoded. Skips comments, `/regex/` literals,
    special-token references and the JSON bodies of `%json` / `%regex` / `%llguidance` (schema strings such
    as descriptions are not markup the model writes verbatim). A rough lexer: enough for generated grammars."""
    i, n = 0, len(lark)
    while i < n:
        char = lark[i]
        if char == "%":
            i = _skip_directive(lark, i)
        elif char == "<":  # a special-token reference: <[151657]>, <|im_end|>, </think>
            i = _closing(lark, i, ">") + 1
        elif lark.startswith("//", i) or char == "#":
            i = _line_end(lark, i)
        elif char == "/":
            i = _closing(lark, i, "/") + 1
        elif char == '"':
            end = _closing(lark, i, '"')
            yield _decode_lark_string(lark[i:end + 1])
            i = end + 1
        else:
            i += 1


def _skip_directive(lark: str, start: int) -> int:
    """Past `%name {json}` (or just past `%name` when no JSON body follows)."""
    match = re.compile(r"%[\w-]+\s*").match(lark, start)
    end = match.end() if match else start + 1
    if end < len(lark) and lark[end] == "{":
        try:
            _, end = json.JSONDecoder().raw_decode(lark, end)
        except ValueError:
            return end + 1
    return end


def _closing(text: str, start: int, quote: str) -> int:
    """Index of the quote that closes the literal opened at `start` (backslash escapes skipped)."""
    i = start + 1
    while i < len(text) and text[i] != quote and text[i] != "\n":
        i += 2 if text[i] == "\\" else 1
    return min(i, len(text) - 1)


def _line_end(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def _decode_lark_string(quoted: str) -> str:
    try:
        return json.loads(quoted)
    except ValueError:  # a Lark-only escape (\x41): the raw text is good enough for a substring check
        return quoted[1:-1]
