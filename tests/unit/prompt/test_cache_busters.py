"""Claude Code's per-session billing header never reaches the prompt, so sessions share prefixes."""

import logging

from zllm.canonical import ChatRequest, Message
from zllm.prompt import PromptRenderer
from zllm.prompt.cache_busters import drop_billing_headers

HEADER = "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;"


def chat(*messages: Message) -> ChatRequest:
    return ChatRequest(id="req_1", model="tiny", messages=messages)


def test_a_header_only_system_message_is_dropped_and_reported(qwen_tokenizer, caplog) -> None:
    renderer = PromptRenderer(qwen_tokenizer)
    plain = renderer.render(chat(Message("system", "You are an agent."), Message("user", "hi")))
    with caplog.at_level(logging.DEBUG, logger="zllm.prompt"):
        headed = renderer.render(chat(Message("system", HEADER), Message("system", "You are an agent."),
                                      Message("user", "hi")))
    assert headed.token_ids == plain.token_ids and headed.dropped == (HEADER,)
    assert "x-anthropic-billing-header" not in headed.text and "dropped 1 per-session" in caplog.text


def test_two_sessions_render_the_same_prompt(qwen_tokenizer) -> None:
    renderer = PromptRenderer(qwen_tokenizer)
    one = chat(Message("system", HEADER + "\nYou are an agent."), Message("user", "hi"))
    two = chat(Message("system", HEADER.replace("0b8", "6ff") + "\nYou are an agent."), Message("user", "hi"))
    assert renderer.render(one).token_ids == renderer.render(two).token_ids
    assert renderer.count(one) == renderer.count(two) == len(renderer.render(one).token_ids)
    assert "You are an agent." in renderer.render_text(one)


def test_other_messages_are_untouched() -> None:
    messages = (Message("user", HEADER), Message("system", "note: " + HEADER))
    assert drop_billing_headers(messages) == (messages, ())
