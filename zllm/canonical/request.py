"""The canonical request: what every wire API normalizes to before the core sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from zllm.errors import InvalidRequest

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ToolCall:
    """A call the assistant made. `arguments` is the JSON text exactly as the model produced it.

    `form` says how the model wrote the call when it did not use its dialect's own markup (a bare JSON object
    `{"name": ..., "arguments": ...}` opening the turn), so the next turn renders it the same way and the prompt
    still continues this turn's tokens. It rides on the id, the one part of a call every client sends back
    (`call_<hex>-bja`; see `with_form`); "" is the dialect's own markup."""

    id: str
    name: str
    arguments: str

    @property
    def form(self) -> str:
        _, dash, suffix = self.id.rpartition("-")
        return suffix if dash and suffix in CALL_FORMS else ""


# the forms a call can be written in besides the dialect's markup: a bare JSON object opening the turn, with
# its arguments under "arguments" or (Llama 3's spelling) "parameters"
BARE_JSON_ARGUMENTS, BARE_JSON_PARAMETERS = "bja", "bjp"
CALL_FORMS = (BARE_JSON_ARGUMENTS, BARE_JSON_PARAMETERS)


def with_form(call_id: str, form: str) -> str:
    """`call_id` carrying `form` (`ToolCall.form` reads it back); "" leaves the id as it is."""
    return f"{call_id}-{form}" if form else call_id


@dataclass(frozen=True)
class Message:
    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    # role == "tool": which call this result answers, and the tool's name when the client gave it
    tool_call_id: str | None = None
    name: str | None = None
    # assistant reasoning echoed back by the client (rendered only where the template keeps it)
    reasoning: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidRequest(f"unknown message role {self.role!r}", param="messages")
        if self.tool_calls and self.role != "assistant":
            raise InvalidRequest("only assistant messages can carry tool calls", param="messages")


@dataclass(frozen=True)
class ToolGrammar:
    """A free-form tool's input grammar (Responses `custom` tools, e.g. Codex's `apply_patch`): the tool takes
    one string whose text must match `definition` (`syntax` "lark" or "regex")."""

    syntax: Literal["lark", "regex"]
    definition: str


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str = ""
    # JSON Schema of the arguments object, as the client sent it
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    # set for free-form tools: `parameters` is then `{"input": string}` and the string follows this grammar
    grammar: ToolGrammar | None = None


@dataclass(frozen=True)
class ResponseFormat:
    """Structured output: the answer text must be JSON matching `schema` (Chat `response_format`
    json_schema / json_object, Responses `text.format`)."""

    schema: dict
    name: str = "response"


@dataclass(frozen=True)
class ToolChoice:
    """`none` | `auto` | `required` | `tool` (then `name` is the one tool allowed)."""

    mode: Literal["none", "auto", "required", "tool"] = "auto"
    name: str | None = None

    def __post_init__(self) -> None:
        if (self.mode == "tool") != (self.name is not None):
            raise InvalidRequest("tool_choice names a tool exactly when its mode is 'tool'", param="tool_choice")


@dataclass(frozen=True)
class SamplingParams:
    """Decode settings. `max_tokens=None` means "up to the end of the context window"."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequest("temperature must be between 0 and 100", param="temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest("top_p must be in (0, 1]", param="top_p")
        if self.top_k < 0:
            raise InvalidRequest("top_k must be >= 0", param="top_k")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:  # what a torch.Generator takes
            raise InvalidRequest("seed must fit in 64 bits", param="seed")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequest("max_tokens must be >= 1", param="max_tokens")
        if any(not s for s in self.stop):
            raise InvalidRequest("stop sequences must be non-empty strings", param="stop")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(frozen=True)
class ChatRequest:
    """One generation request, protocol-free.

    `namespace` is the caller's cache-isolation key (API key or a salt); the runtime adds the model's own
    identity to it. `id` is minted by the edge and used for abort and tracing.
    """

    id: str
    model: str
    messages: tuple[Message, ...]
    sampling: SamplingParams = SamplingParams()
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    namespace: str = ""
    # which API it came from, for traces only: the runtime never branches on it
    api: str = ""
    # prefix-cache hint: a client key (`prompt_cache_key`) or an earlier request id to try first; always
    # verified against the prompt tokens and namespace, so a wrong hint costs nothing but a lookup
    cache_hint: str | None = None
    # reason before answering: True / False as the client asked, None = the model family's default
    thinking: bool | None = None
    response_format: ResponseFormat | None = None
    # what the edge changed in the conversation before submitting it (context edits), for traces only
    notes: tuple[str, ...] = ()
    # prefill the prompt into the prefix cache and generate nothing (Anthropic `max_tokens: 0`, Responses
    # `prompt_cache_options.prewarm`): the stream ends with Finished(PREFILLED) and the prompt's cache split
    # once the prompt is in the cache, which keeps it as it keeps a finished request's. `sampling` is not used
    prefill_only: bool = False
    # the client's reasoning effort as it gave it ("low", "high", ...): families whose prompt states a level
    # (harmony's `Reasoning: high`) render it; None = not given
    reasoning_effort: str | None = None

    def __post_init__(self) -> None:
        if not self.messages:
            raise InvalidRequest("messages must not be empty", param="messages")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise InvalidRequest("tool names must be unique", param="tools")
        if self.tool_choice.mode == "tool" and self.tool_choice.name not in names:
            raise InvalidRequest(f"tool_choice names unknown tool {self.tool_choice.name!r}", param="tool_choice")
