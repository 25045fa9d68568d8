"""Two fingerprints in, a diagnosis out: the part that changed, the tokens missed, the likely cause (the tiny
Qwen model's renderer, from conftest.py)."""

from __future__ import annotations

import pytest

from zllm.canonical import ChatRequest, FunctionTool, Message
from zllm.diagnosis.cache_diagnosis import diagnose
from zllm.diagnosis.explain import explain_between
from zllm.diagnosis.fingerprint import fingerprint_request
from zllm.token_prefix import common_prefix_length

SYSTEM = "You are a coding agent."
BASH = FunctionTool("Bash", "Run a command.", {"type": "object", "properties": {"command": {"type": "string"}}})
READ = FunctionTool("Read", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}})
GREP = FunctionTool("Grep", "Search files.", {"type": "object", "properties": {"pattern": {"type": "string"}}})
REMINDER = "<system-reminder>\nContext left: 61% (48,000 tokens remaining)\n</system-reminder>"


def request(*messages: Message, system: str = SYSTEM, tools=(BASH, READ), model: str = "m", **fields) -> ChatRequest:
    return ChatRequest(id="r", model=model, messages=(Message("system", system), *messages), tools=tuple(tools),
                       **fields)


def compare(renderer, a: ChatRequest, b: ChatRequest):
    fa, fb = (fingerprint_request(r, renderer.render(r)) for r in (a, b))
    return diagnose(fa, fb, compared_with="msg_a", decode=renderer.tokenizer.decode), fa, fb


USER = Message("user", "List the files.")
TURN = (USER, Message("assistant", "Done."), Message("user", "Next."))


def test_appending_is_no_miss(renderer) -> None:
    diagnosis, fa, _ = compare(renderer, request(USER), request(*TURN))
    assert (diagnosis.reason, diagnosis.missed_tokens, diagnosis.reusable_tokens) == (None, 0, len(fa.prompt_ids))


def test_missed_tokens_are_the_earlier_prompt_past_the_divergence(renderer) -> None:
    diagnosis, fa, fb = compare(renderer, request(USER), request(Message("user", "List the Python files."),
                                                                 *TURN[1:]))
    shared = common_prefix_length(fa.prompt_ids, fb.prompt_ids)
    assert (diagnosis.reason, diagnosis.segment) == ("messages", "message 1 (user)")
    assert (diagnosis.divergence, diagnosis.missed_tokens) == (shared, len(fa.prompt_ids) - shared)
    assert diagnosis.cause == "edited_history" and "Python" in diagnosis.request_after


@pytest.mark.parametrize(("tools", "segment", "cause"), [
    ((READ, BASH), "tool 0 (Read)", "reordered_tools"),
    ((BASH, READ, GREP), "tool 2 (Grep)", "tools_added_or_removed"),
    ((BASH, FunctionTool("Read", "Read any file.", READ.parameters)), "tool 1 (Read)", "changed_tool_schema"),
])
def test_tools(renderer, tools, segment: str, cause: str) -> None:
    diagnosis, _, _ = compare(renderer, request(USER), request(*TURN, tools=tools))
    assert (diagnosis.reason, diagnosis.segment, diagnosis.cause) == ("tools", segment, cause)
    assert diagnosis.missed_tokens > 0


def test_a_timestamp_in_the_system_prompt_is_named(renderer) -> None:
    diagnosis, _, _ = compare(renderer, request(USER, system=SYSTEM + " Now: 2026-12-01 10:00 UTC."),
                              request(*TURN, system=SYSTEM + " Now: 2026-12-01 10:05 UTC."))
    assert (diagnosis.reason, diagnosis.segment, diagnosis.cause) == ("system", "system", "timestamp")


def test_a_billing_header_change_is_no_miss_and_is_reported(renderer) -> None:
    header = "x-anthropic-billing-header: cc_version=2.1.332.{}; cch={};\n"
    diagnosis, _, _ = compare(renderer, request(USER, system=header.format("0b8", "a1") + SYSTEM),
                              request(*TURN, system=header.format("6ff", "b2") + SYSTEM))
    assert diagnosis.reason is None
    assert diagnosis.busters == ("normalized: " + header.format("6ff", "b2").strip(),)


def test_a_rewritten_tokens_left_reminder_is_named_as_a_buster(renderer) -> None:
    earlier = request(Message("user", "List the files.\n" + REMINDER))
    later = request(USER, Message("assistant", "Done."), Message("user", "Next.\n" + REMINDER))
    diagnosis, _, _ = compare(renderer, earlier, later)
    assert (diagnosis.reason, diagnosis.segment, diagnosis.cause) == ("messages", "message 1 (user)", "cache_buster")
    assert "tokens-left reminder" in diagnosis.detail


def test_a_setting_that_changes_the_prompt(renderer) -> None:
    diagnosis, _, _ = compare(renderer, request(USER, thinking=False), request(*TURN, thinking=True))
    assert diagnosis.reason in ("options", None)  # a template that ignores `thinking` renders the same
    if diagnosis.reason == "options":
        assert diagnosis.cause == "changed_setting" and "`thinking`" in diagnosis.detail


def test_model_and_unknown_ids(renderer) -> None:
    diagnosis, fa, _ = compare(renderer, request(USER), request(*TURN, model="other"))
    assert (diagnosis.reason, diagnosis.missed_tokens) == ("model", len(fa.prompt_ids))
    current = fingerprint_request(request(USER), renderer.render(request(USER)))
    assert diagnose(None, current, compared_with="msg_x").reason == "not_found"


@pytest.mark.parametrize("change", ["reordered", "added", "model"])
def test_the_hosted_diagnosis_and_explain_miss_say_one_thing(renderer, change: str) -> None:
    """One "why did it miss" (zllm/diagnosis/explain.py): the fingerprint diagnosis behind the hosted APIs and
    `explain-miss --between` name the same cause in the same words."""
    later = {"reordered": request(*TURN, tools=(READ, BASH)), "added": request(*TURN, tools=(BASH, READ, GREP)),
             "model": request(*TURN, model="other")}[change]
    diagnosis, _, _ = compare(renderer, request(USER), later)
    explained = explain_between(request(USER), later, renderer)
    assert (diagnosis.cause, diagnosis.detail) == (explained.cause.value, explained.detail)
