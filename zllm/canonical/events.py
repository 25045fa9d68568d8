"""The canonical event stream a request produces, in order. Exactly one `Finished` ends every stream."""

from __future__ import annotations

from dataclasses import dataclass

from zllm.canonical.finish import FinishReason, Usage


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class ToolCallEnd:
    index: int
    arguments: str  # the whole arguments JSON text, as the model produced it


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    usage: Usage
    # the stop string or token that ended a STOP_SEQUENCE finish
    stop_sequence: str | None = None
    # ERROR only: code and message of the failure (see zllm.errors)
    error_code: str | None = None
    error_message: str | None = None

    def __post_init__(self) -> None:
        assert (self.reason is FinishReason.ERROR) == (self.error_code is not None), "error iff ERROR"


Event = TextDelta | ReasoningDelta | ToolCallStart | ToolCallArgsDelta | ToolCallEnd | Finished
