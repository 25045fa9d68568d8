"""How a request ended, and what it cost."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class FinishReason(enum.Enum):
    STOP = "stop"                    # the model emitted an end-of-turn / EOS token
    LENGTH = "length"                # max_tokens or the context window ran out
    STOP_SEQUENCE = "stop_sequence"  # a client stop string or stop token id matched
    TOOL_CALLS = "tool_calls"        # the turn ended with one or more tool calls
    REPETITION = "repetition"        # the loop guard ended a generation stuck repeating itself
    ABORT = "abort"                  # the client went away or cancelled
    PREFILLED = "prefilled"          # a prefill-only request (ChatRequest.prefill_only): prompt kept, no output
    ERROR = "error"                  # the engine failed; Finished.error says why


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # prompt tokens served from the prefix cache instead of prefilled
    cached_tokens: int = 0
    # prompt tokens prefilled and handed to the prefix cache to keep (the rest of the prompt, when a cache is
    # on and keeps conversations; 0 when it is off): Anthropic's cache_creation_input_tokens. Left out of
    # equality: it says what the cache did with the request, so the same request run with and without a
    # cache (the runtime's reference runs) still compares equal where prompt, output and reuse agree
    cache_write_tokens: int = field(default=0, compare=False)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
