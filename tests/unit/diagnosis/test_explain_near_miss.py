"""explain-miss from daemon near-miss records: only decoded windows and a segment name are left, so the cause
comes from clues in the windows. Records are made the way the daemon makes them (NearMissLog over the real
tokenizer, segments named by zllm/diagnosis/segments.py) and, for the window clues, by hand."""

from __future__ import annotations

import dataclasses

import pytest

from zllm.canonical import ChatRequest, FunctionTool, Message
from zllm.diagnosis.near_miss import NearMiss, NearMissLog
from zllm.diagnosis.segments import position_describer
from zllm.inspect import Cause, explain_near_miss, format_explanation

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = (FunctionTool("Bash", "Run a command.", SCHEMA), FunctionTool("Read", "Read a file.", SCHEMA))


def chat(system: str, tools: tuple[FunctionTool, ...] = TOOLS) -> ChatRequest:
    return ChatRequest(id="r", model="m", tools=tools, messages=(
        Message("system", system), Message("user", "List the files in /repo, please.")))


def daemon_record(renderer, cached: ChatRequest, request: ChatRequest, *, generated: tuple[int, ...] = ()) -> NearMiss:
    """What the daemon logs when `request` nearly hits the sequence `cached` left (its prompt + `generated`)."""
    entry = renderer.render(cached).token_ids + generated
    ids = renderer.render(request).token_ids
    shared = next(i for i, (x, y) in enumerate(zip(entry, ids)) if x != y)
    log = NearMissLog(decode=renderer.tokenizer.decode, min_tokens=1, min_fraction=0.0)
    return log.record(namespace="ns1", entry_id="e1", tier="device", request=ids, entry=entry, shared=shared,
                      prompt_length=len(renderer.render(cached).token_ids),
                      describe=position_describer(renderer, request))


def test_a_timestamp_in_the_system_prompt(renderer) -> None:
    record = daemon_record(renderer, chat("You are an agent. Time: 2025-06-01 10:00:00 UTC."),
                           chat("You are an agent. Time: 2025-06-01 10:05:00 UTC."))
    expl = explain_near_miss(record)
    assert (expl.segment, expl.cause) == ("system block", Cause.TIMESTAMP)
    assert (expl.entry_id, expl.tier, expl.namespace, expl.in_prompt) == ("e1", "device", "ns1", True)


def test_a_per_session_uuid(renderer) -> None:
    record = daemon_record(renderer, chat("You are an agent.\nsession 3f2b8c1e-9a7d-4e21-b0c4-5d6e7f8a9b0c"),
                           chat("You are an agent.\nsession 0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"))
    assert (explain_near_miss(record).segment, explain_near_miss(record).cause) == ("system block",
                                                                                     Cause.SESSION_STAMP)


def test_reordered_tools(renderer) -> None:
    record = daemon_record(renderer, chat("You are an agent."), chat("You are an agent.", tools=TOOLS[::-1]))
    expl = explain_near_miss(record)
    assert (expl.segment, expl.cause) == ("tools", Cause.REORDERED_TOOLS)
    assert "`Read` where the cache has `Bash`" in expl.detail


def test_a_changed_tool_schema(renderer) -> None:
    changed = (TOOLS[0], dataclasses.replace(TOOLS[1], description="Read any file."))
    expl = explain_near_miss(daemon_record(renderer, chat("You are an agent."), chat("You are an agent.", changed)))
    assert (expl.segment, expl.cause) == ("tools", Cause.CHANGED_TOOL_SCHEMA)


def test_a_divergence_inside_the_generated_answer_is_the_template(renderer) -> None:
    base = chat("You are an agent.")
    answered = dataclasses.replace(base, messages=base.messages + (Message("assistant", "Two files."),
                                                                   Message("user", "Thanks.")))
    generated = tuple(renderer.tokenizer.encode("<think>\nok\n</think>\n\nTwo files.<|im_end|>"))
    expl = explain_near_miss(daemon_record(renderer, base, answered, generated=generated))
    assert (expl.in_prompt, expl.cause) == (False, Cause.TEMPLATE_CHANGE)
    assert expl.segment == "message 2 (assistant)"


def record(before: str, cached: str, request: str, segment: str | None = "message 3 (user)", **fields) -> NearMiss:
    return NearMiss(namespace="", entry_id="e", tier="ssd", divergence=2000, entry_tokens=2100, request_tokens=2200,
                    in_prompt=fields.pop("in_prompt", True), before=before, request_after=request,
                    entry_after=cached, segment=segment, **fields)


@pytest.mark.parametrize(("miss", "cause"), [
    (record('{"path": "a", "opts": {', '"depth": 1, "all": true}}', '"all": true, "depth": 1}}'),
     Cause.JSON_SERIALIZATION),
    (record('{"name": "caf', '\\u00e9", "size": 12}', 'é", "size": 12}'), Cause.JSON_SERIALIZATION),
    (record('{"name":', ' "café", "size": 12}', '"café","size":12}'), Cause.JSON_SERIALIZATION),
    (record("Please list the", "  files in the repo and", " files in the repo and then"), Cause.WHITESPACE),
    (record("billing x-anthropic-billing-header: cc_version=2.1.332.0", "b8; cc_entrypoint=cli;",
            "c1; cc_entrypoint=cli;", segment="system"), Cause.SESSION_STAMP),
    (record("Today is ", "Monday, June 1.", "Tuesday, June 2.", segment="system"), Cause.TIMESTAMP),
    (record("<|im_start|>assistant\n", "<think>\n\n</think>\n\nok", "ok<|im_end|>"), Cause.TEMPLATE_CHANGE),
    (record("Please list the", " files", " folders"), Cause.EDITED_HISTORY),
    (record("anything", " at all", " else", segment=None), Cause.UNKNOWN),
])
def test_window_clues(miss: NearMiss, cause: Cause) -> None:
    assert explain_near_miss(miss).cause is cause


def test_the_segment_name_is_the_one_count_tokens_uses() -> None:
    assert explain_near_miss(record("a", "b", "c", segment="system")).segment == "system block"
    assert explain_near_miss(record("a", "b", "c", segment="messages 3-5")).segment == "messages 3-5"


def test_a_different_namespace_or_model_is_said_first() -> None:
    miss = record("Please list the", " files", " folders")
    assert explain_near_miss(miss, request_namespace="other").cause is Cause.DIFFERENT_NAMESPACE
    assert explain_near_miss(miss, request_namespace="").cause is Cause.EDITED_HISTORY
    assert explain_near_miss(miss, entry_model="a", request_model="b").cause is Cause.DIFFERENT_MODEL


def test_a_record_as_a_mapping_from_the_control_socket_and_back_to_json() -> None:
    miss = record("Today is ", "Monday.", "Tuesday.", segment="system")
    data = explain_near_miss({**dataclasses.asdict(miss), "extra": 1}).to_json()
    assert data["cause"] == "timestamp" and data["cause_label"] == "timestamp in the prompt"
    assert (data["divergence"], data["segment"], data["cached_tokens"], data["request_tokens"]) == (
        2000, "system block", 2100, 2200)
    assert (data["cached_after"], data["request_after"], data["tier"]) == ("Monday.", "Tuesday.", "ssd")


def test_format_explanation_shows_where_why_and_both_windows() -> None:
    text = str(format_explanation(explain_near_miss(record("Today is ", "Monday [x].", "Tuesday.", segment="system"))))
    lines = text.splitlines()
    assert lines[0] == "diverged from e (ssd) at token 2000 (cached 2100, request 2200 tokens), in system block"
    assert lines[1] == "cause: timestamp in the prompt"
    assert lines[3:] == ['  before   "…Today is "', '  cached   "Monday [x].…"', '  request  "Tuesday.…"']


def conversation(*messages: Message) -> ChatRequest:
    return ChatRequest(id="r", model="m", tools=TOOLS, messages=(Message("system", "You are an agent."), *messages))


def test_a_changed_mid_conversation_system_message_is_named_a_buster(renderer) -> None:
    ask = Message("user", "List the files in /repo, please.")
    record = daemon_record(renderer, conversation(ask, Message("system", "Deferred tools: WebFetch")),
                           conversation(ask, Message("system", "Deferred tools: WebSearch")))
    expl = explain_near_miss(record)
    assert (expl.segment, expl.cause) == ("message 2 (system)", Cause.CACHE_BUSTER)
    assert "mid-conversation system message" in expl.detail


def test_a_rewritten_tokens_left_reminder_is_named_a_buster(renderer) -> None:
    def ask(tokens: str) -> Message:
        return Message("user", f"List the files.\n<system-reminder>\n{tokens} tokens left\n</system-reminder>")

    expl = explain_near_miss(daemon_record(renderer, conversation(ask("48000")), conversation(ask("31000"))))
    assert (expl.segment, expl.cause) == ("message 1 (user)", Cause.CACHE_BUSTER)
    assert "tokens-left reminder" in expl.detail
