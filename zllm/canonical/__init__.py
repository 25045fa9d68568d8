"""The contract between the protocol edge (api/) and the core (runtime/): plain dataclasses, no torch, no JSON.

Every wire API decodes into a `ChatRequest` and encodes from the stream of `Event`s; every stream ends with
exactly one `Finished`.
"""

from zllm.canonical.client import EngineClient, ModelCard, RequestStream
from zllm.canonical.events import (
    Event,
    Finished,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from zllm.canonical.finish import FinishReason, Usage
from zllm.canonical.request import (
    BARE_JSON_ARGUMENTS,
    BARE_JSON_PARAMETERS,
    CALL_FORMS,
    ChatRequest,
    FunctionTool,
    Message,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolGrammar,
    with_form,
)

__all__ = [
    "BARE_JSON_ARGUMENTS", "BARE_JSON_PARAMETERS", "CALL_FORMS", "ChatRequest", "EngineClient", "Event", "Finished",
    "FinishReason", "FunctionTool", "Message",
    "ModelCard", "ReasoningDelta", "RequestStream", "ResponseFormat", "SamplingParams", "TextDelta", "ToolCall",
    "ToolCallArgsDelta", "ToolCallEnd", "ToolCallStart", "ToolChoice", "ToolGrammar", "Usage", "with_form",
]
