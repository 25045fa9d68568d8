"""Sampled token → canonical events: the text stage (output.py) followed by the dialect's stream parser.

    token id ─▶ OutputProcessor (hide control tokens, detokenize, stop tokens/strings, budget) ─▶ text
             ─▶ StreamParser.feed(text) ─▶ TextDelta / ReasoningDelta / ToolCallStart / ArgsDelta / End

At the end the parser is finished (held text flushed, an open call closed) before the Finished event.

The one rule for "the turn ended for tools", which every API then only spells (Chat `tool_calls`, Anthropic
`tool_use`, Responses `completed`, Ollama `stop`): a turn that ends naturally (STOP: EOS or end of turn)
after at least one call was opened (a ToolCallStart went out) finishes with TOOL_CALLS, closed properly or
not: the call an EOS cut short is still delivered (finish() closes it), so the client must act on it. Any
other ending (LENGTH, STOP_SEQUENCE, REPETITION, ABORT) keeps its own reason, calls or not. Pure CPU, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zllm.canonical import Event, FinishReason, TextDelta, ToolCallEnd, ToolCallStart
from zllm.dialects import StreamParser
from zllm.runtime.output import Ending, OutputProcessor


class PlainTextParser(StreamParser):
    """For requests without a dialect parser: everything is text."""

    def feed(self, text: str) -> list[Event]:
        return [TextDelta(text)] if text else []

    def finish(self) -> list[Event]:
        return []

    @property
    def calls_completed(self) -> int:
        return 0


@dataclass
class TurnOutput:
    text_stage: OutputProcessor
    parser: StreamParser
    call_names: dict[int, str] = field(default_factory=dict)  # call index → tool name, from ToolCallStart
    calls_opened: int = 0  # ToolCallStart events so far: what makes a natural end a TOOL_CALLS one

    @property
    def completion_tokens(self) -> int:
        return self.text_stage.completion_tokens

    def accept(self, token_id: int) -> tuple[list[Event], Ending | None]:
        text, ending = self.text_stage.accept(token_id)
        events = self.parser.feed(text) if text else []
        if ending is not None:
            events += self.parser.finish()
        self.calls_opened += sum(isinstance(event, ToolCallStart) for event in events)
        if ending is not None and ending.reason is FinishReason.STOP and self.calls_opened:
            ending = Ending(FinishReason.TOOL_CALLS)
        return events, ending

    def completed_calls(self, events: list[Event]) -> list[tuple[str, str]]:
        """(name, arguments) of the calls `events` complete; remembers names as calls start."""
        done = []
        for event in events:
            if isinstance(event, ToolCallStart):
                self.call_names[event.index] = event.name
            elif isinstance(event, ToolCallEnd):
                done.append((self.call_names.get(event.index, ""), event.arguments))
        return done

    def close(self) -> list[Event]:
        """The generation was cut off from outside (abort, loop guard): flush what the parser holds."""
        return self.parser.finish()
