"""A proof from its length alone that a prompt cannot fit the window, so it is refused before it is tokenized.

    bound = LengthBound.of(tokenizer)       # None when this tokenizer allows no such proof
    bound.min_tokens(text)                  # every encoding of `text` has at least this many tokens

Tokenizing a huge prompt takes long and much memory; counting its characters takes nothing. The proof reads
only the `tokenizers.Tokenizer` (`tokenizer.backend_tokenizer`, or the object itself): transformers' fast
tokenizers and the llama.cpp path's `TokenizerFiles` (a GGUF's vocabulary as tokenizer.json) get the same one.

Why it holds, for the tokenizers it accepts (BPE models, the family every chat model zllm serves uses):

- every token stands for at most `longest` characters of the normalized text: a vocabulary piece covers at
  most as many characters as it has (byte-level pieces are one character per byte and a character is at
  least one byte; SentencePiece's `▁` stands for one space; a `<0xAB>` byte-fallback piece for one byte of
  a character), an added token for exactly its content, and an unknown character for one `<unk>` each;
- every character gets at least part of a token, except characters the proof counts out: a BPE model looks
  each character (or, byte-level, each byte) up in its vocabulary and, with no `<unk>` and no byte fallback,
  silently drops one it lacks. A byte-level vocabulary may lack a few bytes (the default GGUF's lacks six
  ASCII control characters and bytes UTF-8 never uses), so those ASCII characters are not counted; a
  multi-byte character keeps its continuation bytes, which the proof requires the vocabulary to have;
- normalization only adds characters (Prepend, a Replace that is no shorter), keeps them (Lowercase), or
  composes them (NFC/NFKC), which removes at most three of every four: a character's canonical
  decomposition is at most four code points long;
- pre-tokenization keeps every character, no added token strips the whitespace beside it (`lstrip`/`rstrip`
  fold a run of any length into that one token), and nothing truncates the encoding.

A tokenizer with anything else on its path (a normalizer that may drop characters, a pre-tokenizer that
splits whitespace away, an added token that strips it, `<unk>` fused over runs of unknown characters,
characters dropped beside a normalizer, a WordPiece or Unigram model) gets no bound, and its prompts are
tokenized to be measured (at most `BIG_PROMPT_SLOTS` big ones at once: runtime/client.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

# NFC/NFKC: composing removes at most 3 of the 4 code points of the longest canonical decomposition
_COMPOSING = frozenset({"NFC", "NFKC"})
_KEEPING_NORMALIZERS = frozenset({"NFD", "NFKD", "Prepend", "Lowercase", "Sequence"}) | _COMPOSING
_KEEPING_PRE_TOKENIZERS = frozenset({"Sequence", "ByteLevel", "Metaspace", "Digits", "Punctuation",
                                     "UnicodeScripts", "Split"})
_COMPOSITION_SHRINK = 4


# a byte-fallback vocabulary spells every byte it has no piece for as one of these
_BYTE_PIECES = tuple(f"<0x{byte:02X}>" for byte in range(256))
_CONTINUATION_BYTES = range(0x80, 0xC0)
# the least text counted at once, so that a small `enough` does not mean many short passes
_MIN_STEP = 1 << 16


@dataclass(frozen=True)
class LengthBound:
    # the most characters of the normalized text one token can stand for
    longest_token_chars: int
    # how many characters of the text normalization may fold into one (1: it never removes any)
    shrink: int = 1
    # characters the model drops without a token (ASCII bytes a byte-level vocabulary lacks)
    dropped: frozenset[str] = frozenset()

    @classmethod
    def of(cls, tokenizer) -> LengthBound | None:
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not all(hasattr(backend, name) for name in ("model", "get_vocab", "normalizer", "pre_tokenizer")):
            return None  # a slow (Python) tokenizer: nothing to read the proof off
        if type(backend.model).__name__ != "BPE" or backend.truncation is not None or _strips_whitespace(backend):
            return None
        vocab = backend.get_vocab(with_added_tokens=True)
        pre_tokenizer = _component(backend.pre_tokenizer)
        dropped = _dropped_characters(backend.model, vocab, byte_level=_has_byte_level(pre_tokenizer))
        normalizer = _component(backend.normalizer)
        shrink = _shrink(normalizer)
        if dropped is None or shrink is None or (dropped and normalizer is not None):
            return None  # a normalizer could map kept characters onto dropped ones
        if not _pre_tokenizer_keeps_everything(pre_tokenizer):
            return None
        longest = max(map(len, vocab), default=0)
        return cls(longest, shrink, dropped) if longest > 0 else None

    def min_tokens(self, text: str, *, enough: int | None = None) -> int:
        """A lower bound on the tokens of `text`. With `enough`, counting out dropped characters may stop once
        the bound reaches it: proving a huge prompt too long then reads only a window's worth of it (each
        pass over 50 MB of text takes a tenth of a second)."""
        per_token = self.longest_token_chars * self.shrink
        if not self.dropped:
            return math.ceil(len(text) / per_token)
        step = max(_MIN_STEP, enough * per_token) if enough is not None else len(text) or 1
        counted = 0
        for start in range(0, len(text), step):
            end = min(start + step, len(text))
            counted += end - start - sum(text.count(character, start, end) for character in self.dropped)
            if enough is not None and math.ceil(counted / per_token) >= enough:
                break
        return math.ceil(counted / per_token)


def _dropped_characters(model, vocab: dict[str, int], *, byte_level: bool) -> frozenset[str] | None:
    """The characters this BPE model encodes to nothing; None when that set is unbounded or unknowable (a
    vocabulary without `<unk>` or byte fallback drops any character it has no piece for), or when `<unk>`
    is fused over runs (one token for any number of characters)."""
    unknown = getattr(model, "unk_token", None)
    one_unk_each = unknown is not None and unknown in vocab and not getattr(model, "fuse_unk", True)
    if getattr(model, "byte_fallback", False) and all(piece in vocab for piece in _BYTE_PIECES):
        return frozenset()
    if not byte_level:
        return frozenset() if one_unk_each else None
    missing = [byte for byte, piece in enumerate(_byte_level_alphabet()) if piece not in vocab]
    if not missing or one_unk_each:
        return frozenset()
    if unknown is not None or any(byte in _CONTINUATION_BYTES for byte in missing):
        return None  # fused unknowns, or a multi-byte character that may lose every byte
    return frozenset(chr(byte) for byte in missing if byte < 0x80)


def _strips_whitespace(backend) -> bool:
    """An added token that strips the whitespace beside it is one token for any run of it."""
    return any(token.lstrip or token.rstrip for token in backend.get_added_tokens_decoder().values())


def _byte_level_alphabet() -> list[str]:
    """The character ByteLevel spells each byte as (GPT-2's table): printable Latin-1 bytes as themselves, the
    rest as 256 + their rank among them."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = iter(range(256, 512))
    return [chr(byte) if byte in kept else chr(next(moved)) for byte in range(256)]


def _has_byte_level(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return False
    return pre_tokenizer.get("type") == "ByteLevel" or any(
        _has_byte_level(part) for part in pre_tokenizer.get("pretokenizers", ()))


def _component(component) -> dict | None:
    return None if component is None else json.loads(component.__getstate__())


def _shrink(normalizer: dict | None) -> int | None:
    """How many characters normalization may fold into one; None when it may drop them outright."""
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Replace":
        pattern = normalizer.get("pattern", {}).get("String")
        return 1 if pattern is not None and len(normalizer.get("content", "")) >= len(pattern) else None
    if kind not in _KEEPING_NORMALIZERS:
        return None
    shrinks = [_shrink(part) for part in normalizer.get("normalizers", ())]
    if any(s is None for s in shrinks):
        return None
    return math.prod(shrinks) * (_COMPOSITION_SHRINK if kind in _COMPOSING else 1)


def _pre_tokenizer_keeps_everything(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind not in _KEEPING_PRE_TOKENIZERS or (kind == "Split" and pre_tokenizer.get("behavior") == "Removed"):
        return False
    return all(_pre_tokenizer_keeps_everything(part) for part in pre_tokenizer.get("pretokenizers", ()))
