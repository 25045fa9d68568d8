"""A tag scanner with partial-tag holdback, shared by the dialect parsers.

    scanner = TagScanner(("<tool_call>", "</tool_call>"))
    scanner.feed("Hi <tool")    -> [Piece("Hi ", None)]            # "<tool" might start a tag: held back
    scanner.feed("_call>{...")  -> [Piece("", "<tool_call>"), Piece("{...", None)]
    scanner.flush()             -> [Piece(held text, None)] or []

A `Piece` is text followed by the tag that ended it (None: no tag yet). Matching is exact; a dialect that
tolerates slips (case, escaped tags) lists the variants as extra tags and maps them. Which tags are looked
for can change between feeds (`tags` is a plain attribute): inside a JSON string a parser may look only for
the closer. Split-invariant by construction: the output depends only on the concatenated input.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    text: str
    tag: str | None = None


class TagScanner:
    def __init__(self, tags: tuple[str, ...]):
        self.tags = tags
        self._held = ""

    def feed(self, text: str) -> list[Piece]:
        buffer = self._held + text
        pieces: list[Piece] = []
        while True:
            at, tag = self._first_tag(buffer)
            if tag is None:
                break
            pieces.append(Piece(buffer[:at], tag))
            buffer = buffer[at + len(tag):]
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        emitted = buffer[:len(buffer) - keep]
        if emitted:
            pieces.append(Piece(emitted, None))
        return pieces

    def flush(self) -> list[Piece]:
        held, self._held = self._held, ""
        return [Piece(held, None)] if held else []

    @property
    def held(self) -> str:
        return self._held

    def _first_tag(self, buffer: str) -> tuple[int, str | None]:
        best_at, best_tag = len(buffer), None
        for tag in self.tags:
            at = buffer.find(tag)
            # earliest wins; at one position the longest tag wins ("</tool_call>" over "</")
            if at != -1 and (at < best_at or (at == best_at and best_tag is not None and len(tag) > len(best_tag))):
                best_at, best_tag = at, tag
        return best_at, best_tag

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of some tag."""
        longest = 0
        for tag in self.tags:
            for size in range(min(len(tag) - 1, len(buffer)), longest, -1):
                if buffer.endswith(tag[:size]):
                    longest = size
                    break
        return longest
