"""Stop conditions: client stop strings matched across token boundaries, and stop token ids.

Stop strings work on the streamed text, not on tokens: "END" may arrive as "E" + "ND" or inside "xEND\n".
Text that could still be the start of a stop string is held back and never streamed; when a stop string
completes, it and everything after it are dropped. Example with stop "</a>":

    feed("x</")  -> ("x", None)        "</" held: it might become "</a>"
    feed("b")    -> ("</b", None)      it did not
    feed("</a>y") -> ("", "</a>")      matched: nothing of "</a>y" is emitted
"""

from __future__ import annotations

from dataclasses import dataclass

from zllm.canonical import FinishReason


class StopStringMatcher:
    def __init__(self, stop_strings: tuple[str, ...]):
        assert all(stop_strings), "empty stop strings are rejected in canonical.SamplingParams"
        self.stop_strings = stop_strings
        self._held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Return (text safe to emit, the stop string that matched or None)."""
        if not self.stop_strings:
            return text, None
        buffer = self._held + text
        match = _earliest_match(buffer, self.stop_strings)
        if match is not None:
            index, stop = match
            self._held = ""
            return buffer[:index], stop
        keep = _longest_partial_suffix(buffer, self.stop_strings)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep], None

    def flush(self) -> str:
        """The held text, released because generation ended without completing a stop string."""
        held, self._held = self._held, ""
        return held


def _earliest_match(buffer: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for stop in stops:
        index = buffer.find(stop)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, stop)
    return best


def _longest_partial_suffix(buffer: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `buffer` that is a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
            if buffer.endswith(stop[:length]):
                longest = length
                break
    return longest


@dataclass(frozen=True)
class StopTokens:
    """Token ids that end generation: the model's end-of-turn/EOS ids (STOP) and the client's (STOP_SEQUENCE)."""

    model_ids: frozenset[int]
    client_ids: frozenset[int] = frozenset()

    def reason(self, token_id: int) -> FinishReason | None:
        # the model's own end of turn wins: a client that lists EOS among its stop ids still gets "end of turn"
        if token_id in self.model_ids:
            return FinishReason.STOP
        if token_id in self.client_ids:
            return FinishReason.STOP_SEQUENCE
        return None
