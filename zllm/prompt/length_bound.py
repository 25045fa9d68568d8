"""A proof from its length alone that a prompt cannot fit the window, so it is refused before it is tokenized.

    bound = LengthBound.of(tokenizer)       # None when this tokenizer allows no such proof
    bound.min_tokens(len(text))             # every encoding of `text` has at least this many tokens

Tokenizing a huge prompt takes long and much memory; counting its characters takes nothing.

Why it holds, for the tokenizers it accepts (BPE models, the family every chat model zllm serves uses):

- every token stands for at most `longest` characters of the normalized text: a vocabulary piece covers at
  most as many characters as it has (byte-level pieces are one character per byte and a character is at
  least one byte; SentencePiece's `▁` stands for one space; a `<0xAB>` byte-fallback piece for one byte of
  a character), an added token for exactly its content, and an unknown character for one `<unk>` each;
- normalization only adds characters (Prepend, a Replace that is no shorter), keeps them (Lowercase), or
  composes them (NFC/NFKC), which removes at most three of every four: a character's canonical
  decomposition is at most four code points long;
- pre-tokenization keeps every character.

A tokenizer with anything else on its path (a normalizer that may drop characters, a pre-tokenizer that
splits whitespace away, `<unk>` fused over runs of unknown characters, a WordPiece or Unigram model) gets no
bound, and its prompts are tokenized to be measured, as before.
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


@dataclass(frozen=True)
class LengthBound:
    # the most characters of the normalized text one token can stand for
    longest_token_chars: int
    # how many characters of the text normalization may fold into one (1: it never removes any)
    shrink: int = 1

    @classmethod
    def of(cls, tokenizer) -> LengthBound | None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        convert = getattr(tokenizer, "convert_ids_to_tokens", None)
        if backend is None or convert is None or not _model_covers_every_character(backend.model):
            return None
        shrink = _shrink(_component(backend.normalizer))
        if shrink is None or not _pre_tokenizer_keeps_everything(_component(backend.pre_tokenizer)):
            return None
        pieces = convert(list(range(len(tokenizer))))
        added = (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()
        longest = max([len(piece) for piece in pieces if piece] + [len(token.content) for token in added],
                      default=0)
        return cls(longest, shrink) if longest > 0 else None

    def min_tokens(self, chars: int) -> int:
        return math.ceil(chars / (self.longest_token_chars * self.shrink))


def _model_covers_every_character(model) -> bool:
    """A BPE model whose tokens each cover at least one character: unknown characters become bytes, or one
    `<unk>` each (a fused `<unk>` may stand for a run of any length)."""
    if type(model).__name__ != "BPE":
        return False
    return bool(getattr(model, "byte_fallback", False)) or not getattr(model, "fuse_unk", True)


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
