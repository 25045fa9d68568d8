"""Render a canonical `ChatRequest` to the exact prompt token ids the model sees.

The model's own chat template (Jinja, run by `tokenizer.apply_chat_template`) renders the conversation to
text with the generation prompt appended (`...<|im_start|>assistant\n` for ChatML); the text is then encoded
with `add_special_tokens=False`, so special-token text the template wrote (`<|im_start|>`, `<s>`) becomes one
special token each and nothing is added twice. A tokenizer that normally prepends BOS gets it here only
when the template did not already render it.

Tool calls and tools go to the template in the Hugging Face chat shape:

    {"role": "assistant", "content": "...", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}
    {"role": "tool", "content": "...", "tool_call_id": "call_1", "name": "f"}
    tools=[{"type": "function", "function": {"name": "f", "description": "...", "parameters": {...}}}]

Templates expect `arguments` as an object (they `tojson` it), so JSON-object text is parsed; anything else is
passed through as the string the model produced. Byte-exact re-rendering of past calls is the job of the
tool dialects (a later issue), which will own this conversion per model family.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from zllm.canonical import ChatRequest, FunctionTool, Message, ToolCall
from zllm.errors import ConfigError, InvalidRequest
from zllm.prompt.cache_busters import drop_billing_headers


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: tuple[int, ...]
    # the template's text output (before BOS repair), for traces and debugging
    text: str
    # per-session lines removed before rendering because they defeat the prefix cache (cache_busters.py)
    dropped: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.token_ids)


class PromptRenderer:
    """Turns canonical requests into prompt token ids with one model's tokenizer and chat template.

    Stateless after construction and safe to call from several threads (the tokenizer's Rust encoder is).
    """

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("the model's tokenizer has no chat template", hint="use an instruct/chat model")
        self.tokenizer = tokenizer
        self._bos_id = _default_bos_id(tokenizer)

    def render(self, request: ChatRequest) -> RenderedPrompt:
        messages, dropped = drop_billing_headers(request.messages)
        text = self._render_messages(request, messages)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if self._bos_id is not None and ids[:1] != [self._bos_id]:
            ids = [self._bos_id, *ids]
        return RenderedPrompt(token_ids=tuple(ids), text=text, dropped=dropped)

    def render_text(self, request: ChatRequest) -> str:
        return self._render_messages(request, drop_billing_headers(request.messages)[0])

    def template_text(self, request: ChatRequest, messages: tuple[Message, ...], *, tools: bool = True,
                      add_generation_prompt: bool = True) -> str:
        """The template's text for `messages` (already free of cache busters) with `request`'s tools or none,
        with or without the generation prompt: the partial renders segments.py compares."""
        return self._render_messages(request, messages, tools=tools, add_generation_prompt=add_generation_prompt)

    def token_starts(self, text: str) -> list[int]:
        """Where each token of the prompt ids for `text` (as `render` builds them) starts in `text`: exact with
        a fast tokenizer's offsets, else approximated by the decoded length of each token. A BOS this renderer
        adds starts at 0."""
        try:
            encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids, starts = list(encoded["input_ids"]), [start for start, _ in encoded["offset_mapping"]]
        except (NotImplementedError, KeyError, TypeError):  # a slow (Python) tokenizer has no offsets
            ids, starts, at = self.tokenizer.encode(text, add_special_tokens=False), [], 0
            for token_id in ids:
                starts.append(at)
                at += len(self.tokenizer.decode([token_id]))
        if self._bos_id is not None and ids[:1] != [self._bos_id]:
            starts = [0, *starts]
        return starts

    def _render_messages(self, request: ChatRequest, messages: tuple[Message, ...], *, tools: bool = True,
                         add_generation_prompt: bool = True) -> str:
        if not messages:
            raise InvalidRequest("nothing to render once per-session header lines are removed", param="messages")
        try:
            return self.tokenizer.apply_chat_template(
                to_hf_messages(messages),
                tools=(to_hf_tools(request.tools) or None) if tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
        except Exception as exc:  # jinja2 TemplateError ("roles must alternate", raise_exception(...)), etc.
            raise InvalidRequest(f"the model's chat template rejected the conversation: {exc}",
                                 param="messages") from exc

    def count(self, request: ChatRequest) -> int:
        return len(self.render(request).token_ids)


def _default_bos_id(tokenizer) -> int | None:
    """BOS id when this tokenizer prepends BOS by default (Llama/SentencePiece style), else None."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None:
        return None
    with_specials = tokenizer.encode("a", add_special_tokens=True)
    return bos_id if with_specials[:1] == [bos_id] else None


def to_hf_messages(messages: tuple[Message, ...]) -> list[dict]:
    return [_hf_message(m) for m in messages]


def _hf_message(message: Message) -> dict:
    out: dict = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [_hf_tool_call(call) for call in message.tool_calls]
    if message.role == "tool":
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            out["name"] = message.name
    if message.reasoning is not None:
        out["reasoning_content"] = message.reasoning  # the key Qwen3 / DeepSeek templates read
    return out


def _hf_tool_call(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": _arguments(call)}}


def _arguments(call: ToolCall) -> dict | str:
    try:
        parsed = json.loads(call.arguments)
    except ValueError:
        return call.arguments
    return parsed if isinstance(parsed, dict) else call.arguments


def to_hf_tools(tools: tuple[FunctionTool, ...]) -> list[dict]:
    return [
        {"type": "function",
         "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]
