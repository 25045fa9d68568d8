"""DeepSeek DSML prompts: the official V3.2 vector byte for byte, the V4 framing, generation prompts, prefixes."""

from __future__ import annotations

import pytest

from tests.support.deepseek_models import (
    deepseek_v31_tokenizer,
    vector_input,
    vector_output,
)
from zllm.canonical import FunctionTool, Message, ToolCall
from zllm.dialects.base import Conversation
from zllm.dialects.dsml.dialect import DeepSeekV4Dsml, DeepSeekV32Dsml

V32, V4 = DeepSeekV32Dsml(), DeepSeekV4Dsml()
WEATHER = FunctionTool("get_weather", "Weather for a city", {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]})


def call(id_: str, city: str) -> ToolCall:
    return ToolCall(id_, "get_weather", f'{{"city": "{city}", "days": 2}}')


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_v32_renders_the_official_vector_byte_for_byte(add_generation_prompt: bool) -> None:
    messages, tools = vector_input()
    text = V32.render(Conversation(messages, tools, thinking=True, add_generation_prompt=add_generation_prompt), None)
    expected = vector_output()
    # the file ends with a newline the encoder does not write: the prompt ends at the last assistant's EOS,
    # and a conversation that ends with an assistant turn has no opener to add
    assert expected.endswith("<｜end▁of▁sentence｜>\n")
    assert text == expected[:-1]


def test_v32_generation_prompt_opens_reasoning_only_for_the_last_user_turn() -> None:
    messages = (Message("user", "Hi"), Message("assistant", "Hello!", reasoning="greet"), Message("user", "Bye"))
    thinking = V32.render(Conversation(messages, thinking=True), None)
    assert thinking == ("<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>"
                        "<｜User｜>Bye<｜Assistant｜><think>")
    chat = V32.render(Conversation(messages, thinking=False), None)
    assert chat.endswith("<｜User｜>Bye<｜Assistant｜></think>")
    prefix = V32.render(Conversation(messages, thinking=True, add_generation_prompt=False), None)
    assert prefix == thinking.removesuffix("<｜Assistant｜><think>")


def test_v32_tools_without_a_system_turn_ride_on_an_empty_one() -> None:
    text = V32.render(Conversation((Message("user", "Hi"),), (WEATHER,)), None)
    assert text.startswith("<｜begin▁of▁sentence｜>\n\n## Tools\n\nYou have access to a set of tools")
    assert '{"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object"' in text
    assert text.endswith("</functions>\n<｜User｜>Hi<｜Assistant｜></think>")


def test_v32_tool_results_open_reasoning_after_the_last_user_turn() -> None:
    messages = (Message("user", "Weather?"),
                Message("assistant", "", (call("a", "Paris"), call("b", "Rome")), reasoning="two cities"),
                Message("tool", "sunny", tool_call_id="a"), Message("tool", "rain", tool_call_id="b"))
    text = V32.render(Conversation(messages, (WEATHER,), thinking=True), None)
    assert text.endswith(
        '<｜User｜>Weather?<｜Assistant｜><think>two cities</think>\n\n<｜DSML｜function_calls>\n'
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        '</｜DSML｜function_calls><｜end▁of▁sentence｜>\n\n<function_results>\n<result>sunny</result>\n'
        '<result>rain</result>\n</function_results>\n\n<think>')


def test_v4_merges_tool_results_into_a_user_turn_in_call_order() -> None:
    messages = (Message("system", "Be brief."), Message("user", "Weather?"),
                Message("assistant", "", (call("a", "Paris"), call("b", "Rome")), reasoning="two cities"),
                Message("tool", "rain", tool_call_id="b"), Message("tool", "sunny", tool_call_id="a"))
    text = V4.render(Conversation(messages, (WEATHER,), thinking=True), None)
    assert text.startswith("<｜begin▁of▁sentence｜>Be brief.\n\n## Tools\n\nYou have access to a set of tools to help")
    assert "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">" in text
    assert text.endswith("</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>sunny</tool_result>\n\n"
                         "<tool_result>rain</tool_result><｜Assistant｜><think>")


def test_v4_keeps_every_turns_reasoning_when_tools_are_declared() -> None:
    messages = (Message("user", "Hi"), Message("assistant", "Hello!", reasoning="greet"), Message("user", "Bye"))
    with_tools = V4.render(Conversation(messages, (WEATHER,), thinking=True), None)
    assert "<｜User｜>Hi<｜Assistant｜><think>greet</think>Hello!<｜end▁of▁sentence｜>" in with_tools
    without = V4.render(Conversation(messages, thinking=True), None)
    assert without == ("<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>"
                       "<｜User｜>Bye<｜Assistant｜><think>")


def test_a_prompt_without_opener_is_a_prefix_of_the_next_turns_prompt() -> None:
    """What the prefix cache relies on: turn N's prompt + its output starts turn N+1's prompt."""
    first = (Message("user", "Weather?"),)
    answer = Message("assistant", "", (call("a", "Paris"),), reasoning="check")
    for dialect in (V32, V4):
        prompt = dialect.render(Conversation(first, (WEATHER,), thinking=True), None)
        later = dialect.render(Conversation((*first, answer, Message("tool", "sunny", tool_call_id="a")),
                                            (WEATHER,), thinking=True), None)
        assert later.startswith(prompt + "check</think>\n\n<｜DSML｜")


def test_the_dialects_write_the_prompt_without_a_template() -> None:
    assert not V32.needs_chat_template and not V4.needs_chat_template
    assert V4.single_token_markup == ("｜DSML｜",) and V32.single_token_markup == ()


def test_prompt_special_tokens_encode_as_single_tokens() -> None:
    tokenizer = deepseek_v31_tokenizer()
    text = V32.render(Conversation((Message("user", "Hi"),), thinking=True), None)
    hi = tokenizer.encode("Hi", add_special_tokens=False)
    assert tokenizer.encode(text, add_special_tokens=False) == [0, 128803, *hi, 128804, 128798]
