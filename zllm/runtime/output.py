"""Per-request output processing: sampled token id → text to stream, and whether (and why) the request ends.

Pure CPU, no torch: detokenizer + stop tokens + stop strings + the token budget. The engine loop calls
`accept(token_id)` once per sampled token and streams the returned text; a non-None `Ending` means the
request is over (the text returned with it is the last; held-back text has been flushed into it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from zllm.canonical import FinishReason
from zllm.runtime.detokenizer import IncrementalDetokenizer
from zllm.runtime.stops import StopStringMatcher, StopTokens


@dataclass(frozen=True)
class Ending:
    reason: FinishReason
    stop_sequence: str | None = None


class OutputProcessor:
    def __init__(
        self,
        detokenizer: IncrementalDetokenizer,
        stop_tokens: StopTokens,
        stop_strings: tuple[str, ...],
        max_tokens: int,
        token_text: Callable[[int], str],
        hidden_ids: frozenset[int] = frozenset(),
    ):
        assert max_tokens >= 1, "the client clamps max_tokens to >= 1"
        self._detokenizer = detokenizer
        self._stop_tokens = stop_tokens
        self._stop_strings = StopStringMatcher(stop_strings)
        self._max_tokens = max_tokens
        self._token_text = token_text  # for reporting which stop token id matched
        # control tokens that are never text (<|im_start|> from a confused model); the dialect's markup tokens
        # (<tool_call>, <think>) are NOT hidden even where the tokenizer marks them special
        self._hidden_ids = hidden_ids
        self.completion_tokens = 0

    def accept(self, token_id: int) -> tuple[str, Ending | None]:
        self.completion_tokens += 1
        token_reason = self._stop_tokens.reason(token_id)
        if token_reason is not None:
            # the stop token's own text is never emitted; text held before it is
            stop_sequence = self._token_text(token_id) if token_reason is FinishReason.STOP_SEQUENCE else None
            return self._end(Ending(token_reason, stop_sequence))
        piece = "" if token_id in self._hidden_ids else self._detokenizer.push(token_id)
        text, matched = self._stop_strings.feed(piece)
        if matched is not None:
            return text, Ending(FinishReason.STOP_SEQUENCE, matched)
        if self.completion_tokens >= self._max_tokens:
            rest, ending = self._end(Ending(FinishReason.LENGTH))
            return text + rest, ending
        return text, None

    def _end(self, ending: Ending) -> tuple[str, Ending]:
        """Release held text: the detokenizer's partial character, then whatever no stop string claimed."""
        text, matched = self._stop_strings.feed(self._detokenizer.flush())
        if matched is not None:  # the flushed tail completed a stop string
            return text, Ending(FinishReason.STOP_SEQUENCE, matched)
        return text + self._stop_strings.flush(), ending
