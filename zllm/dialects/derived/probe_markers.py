"""Where special markers sit in a probe's rendering (`<|tool_call_begin|>`, `[ARGS]`, or the vocabulary's added
tokens): the common prefix / suffix of two renderings is snapped to their edges, so that a character-level
comparison never cuts `<|tool_calls_section_begin|>` into two pieces; a literal is cut at them for the fence."""

from __future__ import annotations

import re

_GENERIC_MARKER = re.compile(r"<[|｜][^<>]{0,60}?[|｜]>|<[^<>\s]{1,40}>|\[[A-Z_]{2,30}\]")


class MarkerSpans:
    """The marker-aware comparisons a prober makes (`markers`: the vocabulary's added tokens, longest first)."""

    markers: tuple[str, ...]

    def _marker_spans(self, text: str) -> list[tuple[int, int]]:
        spans = []
        for marker in self.markers:
            at = text.find(marker)
            while at != -1:
                spans.append((at, at + len(marker)))
                at = text.find(marker, at + 1)
        spans += [m.span() for m in _GENERIC_MARKER.finditer(text)]
        return sorted(spans)

    def _inside_marker(self, text: str, at: int) -> int | None:
        """The start of a marker that position `at` cuts through, else None."""
        for start, end in self._marker_spans(text):
            if start < at < end:
                return start
        return None

    def _common_suffix(self, a: str, b: str) -> str:
        size = 0
        while size < min(len(a), len(b)) and a[-1 - size] == b[-1 - size]:
            size += 1
        while size:
            cut_a, cut_b = self._inside_marker(a, len(a) - size), self._inside_marker(b, len(b) - size)
            if cut_a is None and cut_b is None:
                break
            size -= 1
        return a[len(a) - size:]

    def _common_prefix(self, a: str, b: str) -> str:
        size = 0
        while size < min(len(a), len(b)) and a[size] == b[size]:
            size += 1
        while size and (self._inside_marker(a, size) is not None or self._inside_marker(b, size) is not None):
            size -= 1
        return a[:size]


def split_markers(literal: str, markers: tuple[str, ...] = ()) -> list[str]:
    """`literal` cut before and after every special marker in it (the vocabulary's added tokens where known,
    else anything that looks like one): `"\\n<tool_call>\\n<function="` → `["\\n", "<tool_call>", "\\n<function="]`."""
    spans = _marker_spans_in(literal, tuple(sorted(set(markers), key=len, reverse=True)))
    pieces, at = [], 0
    for start, end in spans:
        if start < at:
            continue
        pieces += [literal[at:start], literal[start:end]]
        at = end
    pieces.append(literal[at:])
    return [piece for piece in pieces if piece]


def _marker_spans_in(text: str, markers: tuple[str, ...]) -> list[tuple[int, int]]:
    spans = []
    for marker in markers:
        at = text.find(marker)
        while at != -1:
            spans.append((at, at + len(marker)))
            at = text.find(marker, at + 1)
    if not markers:
        spans += [m.span() for m in _GENERIC_MARKER.finditer(text)]
    return sorted(spans, key=lambda span: (span[0], -span[1]))
