"""Incremental detokenizer: token ids in, text pieces out, never a partial character.

Decoding token by token and concatenating is wrong for both tokenizer families:
- byte-level BPE (GPT-2, Qwen, SmolLM2): one character's UTF-8 bytes can span several tokens; decoding the
  first alone gives U+FFFD;
- SentencePiece (Llama, Mistral): `▁` marks a space and the decoder strips the first one of a sequence, so a
  lone `▁world` decodes to `world`; byte-fallback tokens `<0xE6><0x97><0xA5>` spell one character.

So each step decodes a small window: `ids[prefix:read]` (text already emitted, kept as context) and
`ids[prefix:]`; the new piece is the difference. A piece ending in U+FFFD is an incomplete character: held
until more tokens complete it, or until `flush()` at the end (then it is as the full decode has it).
Windows start where an earlier decode ended cleanly, so each step costs O(window), not O(output).

Invariant (tested): concat(push(t) for t in ids) + flush() == decode(ids, skip_special_tokens=True).
One exception, garbage only: SentencePiece's ByteFallback decoder replaces an *invalid* run of `<0xNN>` tokens
with one U+FFFD per byte, ASCII bytes of the run included, so an ASCII byte streamed before the run turned
invalid shows as itself here and as U+FFFD in the full decode. Valid text is never affected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"


def raw_decoder(tokenizer, *, skip_special_tokens: bool = True) -> Callable[[Sequence[int]], str]:
    """`ids -> text` without any post-processing (no clean_up_tokenization_spaces), fastest available."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(
        list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )


class IncrementalDetokenizer:
    def __init__(self, tokenizer, *, skip_special_tokens: bool = True):
        self._decode = raw_decoder(tokenizer, skip_special_tokens=skip_special_tokens)
        self.ids: list[int] = []
        # ids[prefix_offset:read_offset] were emitted already and are decoded again only as context
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_text = ""  # decode(ids[prefix_offset:read_offset]), cached while the offsets stay

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ("" while a character is still partial)."""
        self.ids.append(token_id)
        window_text = self._decode(self.ids[self._prefix_offset:])
        if len(window_text) <= len(self._prefix_text) or window_text.endswith(REPLACEMENT_CHAR):
            return ""
        piece = window_text[len(self._prefix_text):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        self._prefix_text = self._decode(self.ids[self._prefix_offset:self._read_offset])
        return piece

    def flush(self) -> str:
        """The text still held back (an incomplete character decodes to U+FFFD, as in the full decode)."""
        window_text = self._decode(self.ids[self._prefix_offset:])
        piece = window_text[len(self._prefix_text):]
        self._prefix_offset = self._read_offset = len(self.ids)
        self._prefix_text = ""
        return piece
