"""Claude Code's per-session billing header never reaches the prompt, so sessions share prefixes."""

import logging

from zllm.canonical import ChatRequest, Message
from zllm.diagnosis.busters import (
    MID_CONVERSATION_SYSTEM,
    TOKENS_LEFT_REMINDER,
    describe_busters,
    drop_billing_headers,
    reported_busters,
)
from zllm.prompt import PromptRenderer

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
    assert "You are an agent." in renderer.render(one).text


def test_other_messages_are_untouched() -> None:
    # a user message that quotes the header, and a system line that mentions it without starting with it
    messages = (Message("user", HEADER), Message("system", "note: " + HEADER))
    assert drop_billing_headers(messages) == (messages, ())


def test_a_header_on_a_later_line_with_cch_goes_too() -> None:
    header = "x-anthropic-billing-header: cc_version=2.1.340.1a2; cc_entrypoint=cli; cch=5e1f0;"
    kept, removed = drop_billing_headers((Message("system", "You are an agent.\n" + header + "\nBe brief."),))
    assert kept == (Message("system", "You are an agent.\nBe brief."),) and removed == (header,)


REMINDER = "<system-reminder>\nToken usage: 51234/200000; 148766 tokens left\n</system-reminder>"


def test_busters_the_model_reads_are_reported_not_removed(qwen_tokenizer) -> None:
    messages = (Message("system", "You are an agent."), Message("user", "hi\n" + REMINDER),
                Message("system", "# Environment\nToday's date is 2026-12-01."), Message("user", "and then?"))
    assert reported_busters(messages) == ((1, TOKENS_LEFT_REMINDER), (2, MID_CONVERSATION_SYSTEM))
    rendered = PromptRenderer(qwen_tokenizer).render(chat(*messages))
    assert "tokens left" in rendered.text and "Today's date" in rendered.text  # kept for the model
    notes = describe_busters((HEADER,), reported_busters(messages))
    assert notes[0] == f"dropped per-session line: {HEADER}"
    assert notes[1].startswith("trailing tokens-left reminder in message 1 (kept")
    assert notes[2].startswith("mid-conversation system message in message 2")


def test_a_reminder_that_is_not_trailing_or_not_about_tokens_is_no_buster() -> None:
    assert reported_busters((Message("user", REMINDER + "\nnow fix the bug"),)) == ()
    assert reported_busters((Message("user", "hi\n<system-reminder>Be careful.</system-reminder>"),)) == ()
    # a leading system message (and a second one before any turn) is the system prompt, not a buster
    assert reported_busters((Message("system", "a"), Message("system", "b"), Message("user", "hi"))) == ()
