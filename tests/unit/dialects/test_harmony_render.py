"""The harmony renderer against gpt-oss's own chat template (tests/golden/gpt-oss/, run by transformers'
`apply_chat_template` over the o200k_harmony stand-in): the same text, hence the same tokens, for conversations
the template can express — tools of many schema shapes, reasoning kept or dropped, results, efforts."""

from __future__ import annotations

import json

import pytest

from tests.support.harmony_models import harmony_tokenizer_or_skip
from zllm.canonical import FunctionTool, Message, ToolCall
from zllm.dialects.base import Conversation
from zllm.dialects.harmony.dialect import Harmony
from zllm.dialects.harmony.render import render_prompt

SHELL = FunctionTool("shell", "Runs a shell command.", {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The command and its arguments"},
        "workdir": {"type": "string", "description": "Working directory"},
        "timeout_ms": {"type": "number", "default": 1000},
        "mode": {"type": "string", "enum": ["fast", "safe"], "default": "safe"},
        "env": {"type": "object", "properties": {"name": {"type": "string"}, "value": {"type": ["string", "null"]}},
                "required": ["name"]},
        "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "integer"}}}},
        "target": {"oneOf": [{"type": "string", "description": "a path"}, {"type": "integer", "default": 3}]},
        "flag": {"type": "boolean", "nullable": True},
        "note": {"type": "string", "nullable": True},
        "anything": {},
        "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "blob": {"type": "object"},
        "choice": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["command"],
})
WEATHER = FunctionTool("get_weather", "Weather for a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
NO_ARGS = FunctionTool("list_files", "Lists files", {"type": "object", "properties": {}})
TOOLS = (SHELL, WEATHER, NO_ARGS)
CALL_A = ToolCall("c1", "get_weather", json.dumps({"city": "Paris"}))
CALL_B = ToolCall("c2", "shell", json.dumps({"command": ["ls", "-la"], "workdir": "/tmp/é"}))


def to_template(messages: tuple[Message, ...], tools: tuple[FunctionTool, ...]) -> tuple[list[dict], list[dict]]:
    """The conversation as transformers hands it to a chat template: arguments as objects, reasoning as
    `thinking` (present only when the client sent reasoning)."""
    out = []
    for m in messages:
        item: dict = {"role": m.role, "content": m.content}
        if m.reasoning is not None:
            item["thinking"] = m.reasoning
        if m.tool_calls:
            item["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                  for c in m.tool_calls]
        out.append(item)
    specs = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.parameters}} for t in tools]
    return out, specs


def template_text(tokenizer, messages, tools, *, add_generation_prompt=True, effort=None) -> str:
    plain, specs = to_template(messages, tools)
    kwargs = {"reasoning_effort": effort} if effort is not None else {}
    return tokenizer.apply_chat_template(plain, tools=specs or None, add_generation_prompt=add_generation_prompt,
                                         tokenize=False, **kwargs)


CONVERSATIONS = {
    "plain": (Message("user", "Hi"),),
    "system-and-tools": (Message("system", "Be brief."), Message("user", "Weather?")),
    "call-pending-reasoning-kept": (
        Message("system", "Be brief."), Message("user", "Weather?"),
        Message("assistant", "", reasoning="Check Paris.", tool_calls=(CALL_A,)),
        Message("tool", "sunny", tool_call_id="c1")),
    "two-calls-in-a-turn": (
        Message("user", "Weather, then files?"),
        Message("assistant", "", reasoning="Paris first.", tool_calls=(CALL_A,)),
        Message("tool", "sunny \"hot\"\nnight: cold", tool_call_id="c1"),
        Message("assistant", "", reasoning="Now the shell.", tool_calls=(CALL_B,)),
        Message("tool", "a\nb", tool_call_id="c2")),
    "answered-turn-drops-reasoning": (
        Message("user", "Weather?"),
        Message("assistant", "", reasoning="Check Paris.", tool_calls=(CALL_A,)),
        Message("tool", "sunny", tool_call_id="c1"),
        Message("assistant", "It is sunny.", reasoning="Done."),
        Message("user", "Thanks. Files?")),
    "text-with-a-call-is-analysis": (
        Message("user", "Weather?"),
        Message("assistant", "Let me look.", tool_calls=(CALL_A,)),
        Message("tool", "sunny", tool_call_id="c1")),
    "no-tools-history": (
        Message("system", "S"), Message("user", "a"), Message("assistant", "b"), Message("user", "ü")),
}


@pytest.fixture(scope="module")
def tokenizer():
    return harmony_tokenizer_or_skip()


@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_equals_the_gpt_oss_template(tokenizer, name, with_tools) -> None:
    messages = CONVERSATIONS[name]
    tools = TOOLS if with_tools else ()
    ours = Harmony().render(Conversation(messages, tools), None)
    assert ours == template_text(tokenizer, messages, tools)
    # the same tokens too (the text is the whole contract, but the vocabulary is what the model sees)
    assert tokenizer.encode(ours, add_special_tokens=False) == tokenizer.encode(
        template_text(tokenizer, messages, tools), add_special_tokens=False)


@pytest.mark.parametrize("effort,level", [("high", "high"), ("low", "low"), ("medium", "medium")])
def test_reasoning_effort_is_the_system_messages_level(tokenizer, effort, level) -> None:
    messages = CONVERSATIONS["system-and-tools"]
    ours = Harmony().render(Conversation(messages, TOOLS, reasoning_effort=effort), None)
    assert ours == template_text(tokenizer, messages, TOOLS, effort=level)
    assert f"Reasoning: {level}\n" in ours


def test_efforts_gpt_oss_has_no_level_for_map_to_the_nearest() -> None:
    for effort, level in (("none", "low"), ("minimal", "low"), ("xhigh", "high"), (None, "medium")):
        text = render_prompt(Conversation((Message("user", "q"),), reasoning_effort=effort))
        assert f"Reasoning: {level}\n" in text


def test_last_answer_without_generation_prompt_ends_with_return(tokenizer) -> None:
    messages = (Message("user", "Hi"), Message("assistant", "Hello.", reasoning="Greet."))
    ours = Harmony().render(Conversation(messages, add_generation_prompt=False), None)
    assert ours == template_text(tokenizer, messages, (), add_generation_prompt=False)
    assert ours.endswith("<|start|>assistant<|channel|>analysis<|message|>Greet.<|end|>"
                         "<|start|>assistant<|channel|>final<|message|>Hello.<|return|>")


@pytest.mark.parametrize("api,body,effort", [
    ("chat", {"reasoning_effort": "high"}, "high"),
    ("responses", {"reasoning": {"effort": "low"}}, "low"),
    ("ollama", {"think": "high"}, "high"),
    ("ollama", {"think": True}, None),
    ("chat", {}, None),
])
def test_each_api_hands_the_clients_effort_to_the_prompt(api, body, effort) -> None:
    """The effort reaches `ChatRequest.reasoning_effort`, which the renderer puts in the Conversation."""
    from zllm.api.ollama.decode import decode_chat
    from zllm.api.openai_chat.decode import decode_chat_request
    from zllm.api.openai_responses.decode import chat_request, decode_responses_request, plan_turn

    user = [{"role": "user", "content": "hi"}]
    if api == "chat":
        request = decode_chat_request({"model": "m", "messages": user, **body}, request_id="r", namespace="").request
    elif api == "ollama":
        request = decode_chat({"model": "m", "messages": user, **body}, request_id="r", namespace="").request
    else:
        call = decode_responses_request({"model": "m", "input": "hi", **body})
        request = chat_request(call, plan_turn(call, None), request_id="r", namespace="")
    assert request.reasoning_effort == effort
