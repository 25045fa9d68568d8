"""Hermes / Qwen3 rendering: byte-equal to Qwen2.5's own template, built-in ChatML, default system prompts,
Qwen3 reasoning rules, and render ⇄ parse: turn N+1's prompt extends turn N's prompt plus its output."""

import json

import pytest

from tests.support.dialect_harness import counter, parse_all
from zllm.canonical import (
    FunctionTool,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
)
from zllm.dialects.base import Conversation
from zllm.dialects.hermes.dialect import HermesJson, Qwen3Hermes
from zllm.dialects.hermes.render import assistant_text, template_default_system, tools_block

WEATHER = FunctionTool("get_weather", "Météo d'une ville — 天气", {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]})
PING = FunctionTool("ping")
TOOLS = (WEATHER, PING)


def weather(call_id, city, **extra):
    return ToolCall(call_id, "get_weather", json.dumps({"city": city, **extra}, ensure_ascii=False))


def tool_result(call_id, content):
    return Message("tool", content, tool_call_id=call_id, name="get_weather")


CONVERSATION = (
    Message("system", "You are terse."),
    Message("user", "Weather in Paris and Tōkyō?"),
    Message("assistant", "Checking both.", tool_calls=(weather("c1", "Paris"), weather("c2", "Tōkyō", days=2))),
    tool_result("c1", "18°C"),
    tool_result("c2", '{"temp": 21}'),
    Message("assistant", "Paris 18°C, Tōkyō 21°C."),
    Message("user", "Ping?"),
    Message("assistant", "", tool_calls=(ToolCall("c3", "ping", "{}"),)),
    tool_result("c3", "pong"),
)


def template_of(tokenizer):
    def template(messages, *, add_generation_prompt):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)

    return template


def reference_render(tokenizer, messages, tools):
    """The Qwen2.5 template's own rendering, from `tools=` and `tool_calls` in the Hugging Face shape."""
    hf_messages = []
    for m in messages:
        entry = {"role": m.role, "content": m.content}
        if m.tool_calls:
            entry["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                   for c in m.tool_calls]
        hf_messages.append(entry)
    hf_tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}} for t in tools] or None
    return tokenizer.apply_chat_template(hf_messages, tools=hf_tools, add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("messages", [CONVERSATION, CONVERSATION[1:]], ids=["with_system", "default_system"])
@pytest.mark.parametrize("tools", [TOOLS, ()], ids=["tools", "no_tools"])
def test_equals_the_qwen25_template_rendering_tools_itself(messages, tools, qwen_tokenizer):
    ours = HermesJson().render(Conversation(messages, tools), template_of(qwen_tokenizer))
    assert ours == reference_render(qwen_tokenizer, messages, tools)


def test_qwen25_default_system_prompt_is_found_by_probing(qwen_tokenizer):
    assert template_default_system(template_of(qwen_tokenizer)) == (
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")


def chatml_with_default(messages, *, add_generation_prompt):
    """A SmolLM2-like ChatML template: its own default system prompt, tools ignored."""
    if messages[0]["role"] != "system":
        messages = [{"role": "system", "content": "You are a helpful AI assistant."}, *messages]
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_default_system_prompt_of_any_template_is_kept_before_the_tools():
    text = HermesJson().render(Conversation((Message("user", "Hi"),), (PING,)), chatml_with_default)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant.\n\n# Tools\n\n")


def test_without_a_default_system_prompt_the_tools_block_stands_alone():
    assert template_default_system(None) == ""
    text = HermesJson().render(Conversation((Message("user", "Hi"),), (PING,)), None)
    assert text == ("<|im_start|>system\n" + tools_block((PING,)) + "<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_rejects_the_probe_has_no_default():
    def strict(messages, *, add_generation_prompt):
        raise ValueError("roles must alternate")

    assert template_default_system(strict) == ""


def test_builtin_chatml_framing():
    messages = (Message("user", "Hi"), Message("assistant", "Hello", tool_calls=(ToolCall("c", "ping", "{}"),)),
                tool_result("c", "a"), tool_result("c", "b"))
    assert HermesJson().render(Conversation(messages), None) == (
        "<|im_start|>user\nHi<|im_end|>\n"
        '<|im_start|>assistant\nHello\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    assert HermesJson().render(Conversation(messages[:1], add_generation_prompt=False), None) == (
        "<|im_start|>user\nHi<|im_end|>\n")


def test_arguments_are_rendered_in_canonical_spelling_and_malformed_ones_as_written():
    message = Message("assistant", "", tool_calls=(ToolCall("a", "f", '{"x":1,"y" : ["é"]}'),
                                                   ToolCall("b", "g", '{"x": tru')))
    assert assistant_text(message) == ('<tool_call>\n{"name": "f", "arguments": {"x": 1, "y": ["é"]}}\n</tool_call>\n'
                                       '<tool_call>\n{"name": "g", "arguments": {"x": tru}\n</tool_call>')


def test_hermes_drops_reasoning():
    messages = (Message("user", "Hi"), Message("assistant", "Hello", reasoning="secret"))
    assert "secret" not in HermesJson().render(Conversation(messages, thinking=True), None)


def test_qwen3_keeps_reasoning_only_after_the_last_user_message():
    messages = (
        Message("user", "Q1"), Message("assistant", "A1", reasoning="R1"),
        Message("user", "Q2"), Message("assistant", "", reasoning="R2", tool_calls=(ToolCall("c", "ping", "{}"),)),
        tool_result("c", "pong"), Message("assistant", "A2"),
    )
    text = Qwen3Hermes().render(Conversation(messages, thinking=True), None)
    assert "R1" not in text and "<|im_start|>assistant\nA1<|im_end|>" in text
    assert '<|im_start|>assistant\n<think>\nR2\n</think>\n\n<tool_call>\n{"name": "ping"' in text
    # no reasoning given: the empty block the model saw (thinking off) or wrote (an empty thought)
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_qwen3_thinking_off_ends_the_prompt_with_an_empty_thought():
    messages = (Message("user", "Hi"),)
    assert Qwen3Hermes().render(Conversation(messages, thinking=False), None).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert Qwen3Hermes().render(Conversation(messages, thinking=True), None).endswith("<|im_start|>assistant\n")
    prefix = Qwen3Hermes().render(Conversation(messages, thinking=False, add_generation_prompt=False), None)
    assert prefix == "<|im_start|>user\nHi<|im_end|>\n"


# ------------------------------------------------------------------------------ render ⇄ parse


def parsed_turn(dialect, output, *, thinking):
    """The assistant message a client sends back after receiving `output`'s events."""
    events = parse_all(lambda: dialect.parser(TOOLS, thinking=thinking, new_call_id=counter()), output)
    names = {e.index: (e.id, e.name) for e in events if isinstance(e, ToolCallStart)}
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    return Message("assistant", "".join(e.text for e in events if isinstance(e, TextDelta)),
                   tool_calls=tuple(ToolCall(*names[e.index], e.arguments) for e in events if isinstance(e, ToolCallEnd)),
                   reasoning=reasoning or None)


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "note": "a \\"q\\" \\\\ é"}}\n</tool_call>'
PING_CALL = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
OUTPUTS = ["Hello.", "", CALL, "Let me check.\n" + CALL, CALL + "\n" + PING_CALL, "Two lines\n\n" + CALL,
           "\n\nLeading newlines", '<tool_call>\n{"name": "ping", "arguments": {"deep": [{"a": [1, 2.5]}, null]}}\n</tool_call>']
THOUGHTS = ["<think>\nPlan.\n</think>\n\n", "<think>\n\n</think>\n\n", "<think>\nMulti\n\nline\n\n</think>\n\n"]


def assert_next_prompt_extends(dialect, template, output, *, thinking):
    """Turn N's prompt + its output (+ end of turn) is a prefix of turn N+1's prompt."""
    history = (Message("system", "Be brief."), Message("user", "Weather?"))
    before = dialect.render(Conversation(history, TOOLS, thinking=thinking), template)
    turn = parsed_turn(dialect, output, thinking=thinking)
    results = tuple(tool_result(c.id, "ok") for c in turn.tool_calls)
    after = dialect.render(Conversation((*history, turn, *results), TOOLS, thinking=thinking), template)
    assert after.startswith(before + output + "<|im_end|>\n")


@pytest.mark.parametrize("output", OUTPUTS)
def test_hermes_round_trip_through_the_qwen25_template(output, qwen_tokenizer):
    assert_next_prompt_extends(HermesJson(), template_of(qwen_tokenizer), output, thinking=False)


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("thought", THOUGHTS)
def test_qwen3_round_trip_thinking_on(output, thought):
    assert_next_prompt_extends(Qwen3Hermes(), None, thought + output, thinking=True)


@pytest.mark.parametrize("output", OUTPUTS)
def test_qwen3_round_trip_thinking_off(output):
    assert_next_prompt_extends(Qwen3Hermes(), None, output, thinking=False)
