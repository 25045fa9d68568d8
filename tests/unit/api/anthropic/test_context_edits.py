"""Context editing (Anthropic `context_management.edits`): the wire spec, the edit semantics, the placement that
keeps the prefix cache, and the `applied_edits` answer, in-process against the fake engine (1 token = 1 word)."""

from __future__ import annotations

import asyncio
import json

import anthropic
import pytest

from tests.support.fake_engine import FAKE_MODEL, FakeEngineClient, text_events
from zllm.api.anthropic_messages.context_management import decode_context_management
from zllm.api.context_edits import (
    ClearThinking,
    ClearToolUses,
    Compact,
    ContextEdits,
    Threshold,
    apply_context_edits,
)
from zllm.api.context_edits.tool_uses import CLEARED_INPUT, PLACEHOLDER
from zllm.api.summary import SUMMARY_PROMPT, summary_message
from zllm.canonical import ChatRequest, Message, ToolCall
from zllm.errors import InvalidRequest

MODEL = FAKE_MODEL.id
RESULT_WORDS = 100


def tool_session(turns: int, *, names=("Bash",), reasoning: bool = False) -> tuple[Message, ...]:
    """A system prompt, a user task, then `turns` tool round trips of RESULT_WORDS-word results."""
    messages = [Message("system", "You are an agent."), Message("user", "fix the bug")]
    for t in range(turns):
        name = names[t % len(names)]
        messages.append(Message("assistant", f"step {t}", reasoning=f"think {t}" if reasoning else None,
                                tool_calls=(ToolCall(f"call_{t}", name, json.dumps({"cmd": f"run {t}"})),)))
        messages.append(Message("tool", " ".join(f"w{t}" for _ in range(RESULT_WORDS)),
                                tool_call_id=f"call_{t}", name=name))
    return tuple(messages)


def edit(messages: tuple[Message, ...], *edits) -> tuple[tuple[Message, ...], tuple]:
    request = ChatRequest(id="r", model=MODEL, messages=messages)
    result = asyncio.run(apply_context_edits(request, ContextEdits(tuple(edits)), FakeEngineClient()))
    return result.request.messages, result.applied


def cleared_results(messages) -> list[str]:
    return [m.tool_call_id for m in messages if m.role == "tool" and m.content == PLACEHOLDER]


# -- semantics ------------------------------------------------------------------------------------------------


def test_below_the_trigger_nothing_is_cleared():
    messages = tool_session(5)  # ~550 words
    edited, applied = edit(messages, ClearToolUses(trigger=Threshold("input_tokens", 1000)))
    assert edited == messages and applied == ()


def test_a_trigger_clears_every_tool_use_but_the_last_keep():
    spec = ClearToolUses(trigger=Threshold("input_tokens", 1000), keep=3)
    first = next(t for t in range(1, 40) if edit(tool_session(t), spec)[1])  # the turn that passes 1000 tokens
    assert first == 9  # 9 turns of ~115 tokens
    edited, applied = edit(tool_session(first), spec)
    assert cleared_results(edited) == [f"call_{t}" for t in range(first - 3)]
    assert applied[0].kind == "clear_tool_uses" and applied[0].cleared == first - 3
    assert applied[0].cleared_tokens == (first - 3) * (RESULT_WORDS - len(PLACEHOLDER.split()))
    messages = edited
    # the calls' arguments stay unless asked
    assert all(call.arguments != CLEARED_INPUT for m in edited for call in m.tool_calls)


def test_excluded_tools_and_cleared_inputs():
    messages = tool_session(12, names=("Bash", "Read"))
    edited, _ = edit(messages, ClearToolUses(trigger=Threshold("input_tokens", 1000), keep=2,
                                             exclude_tools=frozenset({"Read"}), clear_inputs=True))
    assert cleared_results(edited) == [f"call_{t}" for t in range(0, 10, 2)]  # Bash only, the last 2 kept
    arguments = {call.id: call.arguments for m in edited for call in m.tool_calls}
    assert [arguments[f"call_{t}"] == CLEARED_INPUT for t in (0, 1, 10)] == [True, False, False]


def test_clear_inputs_for_named_tools_only():
    messages = tool_session(12, names=("Bash", "Read"))
    edited, _ = edit(messages, ClearToolUses(trigger=Threshold("input_tokens", 1000), keep=2,
                                             clear_inputs=frozenset({"Read"})))
    arguments = {call.id: call.arguments for m in edited for call in m.tool_calls}
    assert (arguments["call_0"], arguments["call_1"]) == (json.dumps({"cmd": "run 0"}), CLEARED_INPUT)


def test_clear_at_least_out_of_reach_changes_nothing():
    messages = tool_session(12)
    spec = ClearToolUses(trigger=Threshold("input_tokens", 1000), keep=10, clear_at_least=500)
    assert edit(messages, spec) == (messages, ())  # 2 clearable results free ~180 tokens < 500
    edited, applied = edit(messages, ClearToolUses(trigger=Threshold("input_tokens", 1000), keep=10))
    assert applied[0].cleared == 2


def test_tool_uses_trigger():
    messages = tool_session(6)
    assert edit(messages, ClearToolUses(trigger=Threshold("tool_uses", 6)))[1] == ()
    edited, applied = edit(messages, ClearToolUses(trigger=Threshold("tool_uses", 5), keep=1))
    assert applied[0].cleared == 5 and cleared_results(edited) == [f"call_{t}" for t in range(5)]


def test_clear_thinking_keeps_the_last_turns():
    messages = tool_session(4, reasoning=True)
    edited, applied = edit(messages, ClearThinking(keep=1))
    assert [m.reasoning for m in edited if m.role == "assistant"] == [None, None, None, "think 3"]
    assert (applied[0].kind, applied[0].cleared, applied[0].cleared_tokens) == ("clear_thinking", 3, 6)
    assert edit(messages, ClearThinking(keep=None)) == (messages, ())


def test_compact_alone_edits_nothing_here():
    messages = tool_session(12)
    assert edit(messages, Compact(trigger=10)) == (messages, ())  # the route runs compaction (a summary)


# -- placement: the cleared block stays put for turns, so the prefix cache keeps hitting --------------------


def test_replayed_turns_keep_their_prefix_until_the_edited_prompt_passes_the_trigger_again():
    """40 tool turns, trigger 2000 tokens: each turn's edited prompt extends the last turn's (a cache hit) except
    on the few turns where a new activation clears a block; the stateless rule would change it every turn."""
    spec = ClearToolUses(trigger=Threshold("input_tokens", 2000), keep=3)
    previous, activations = None, []
    for turns in range(1, 41):
        history = tool_session(turns)
        edited, applied = edit(history, spec)
        assert sum(len(m.content.split()) for m in edited) < 2000 + 2 * RESULT_WORDS  # stays inside the budget
        extends = previous is not None and edited[:len(previous)] == previous
        if applied and applied[0].reprefill_tokens:
            activations.append(turns)
            assert not extends
        else:
            assert previous is None or extends, f"turn {turns} changed the prefix without an activation"
        previous = edited
    assert 2 <= len(activations) <= 6, activations  # a block at a time, not one per turn
    assert all(b - a >= 5 for a, b in zip(activations, activations[1:])), activations


def test_the_reprefill_cost_is_what_follows_the_first_newly_cleared_message():
    spec = ClearToolUses(trigger=Threshold("input_tokens", 1000), keep=3)
    first = next(t for t in range(1, 40) if edit(tool_session(t), spec)[1])
    edited, applied = edit(tool_session(first), spec)
    start = next(i for i, m in enumerate(edited) if m.content == PLACEHOLDER)  # call_0's result
    weights = [4 + len(m.content.split()) + sum(1 + len(c.arguments.split()) + 6 for c in m.tool_calls)
               for m in edited]
    assert applied[0].reprefill_tokens == sum(weights[start:])
    assert edit(tool_session(first + 1), spec)[1][0].reprefill_tokens == 0  # the next turn replays it: no cost


# -- the wire spec ------------------------------------------------------------------------------------------------


def test_decode_defaults_and_claude_codes_edit():
    edits = decode_context_management({"context_management": {"edits": [
        {"type": "clear_thinking_20251015", "keep": "all"},
        {"type": "clear_tool_uses_20250919"},
        {"type": "compact_20260112", "pause_after_compaction": True}]}})
    assert edits.edits == (ClearThinking(keep=None), ClearToolUses(), Compact(pause_after=True))
    assert decode_context_management({}) is None
    full = decode_context_management({"context_management": {"edits": [{
        "type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 6000},
        "keep": {"type": "tool_uses", "value": 2}, "clear_at_least": {"type": "input_tokens", "value": 500},
        "exclude_tools": ["Read"], "clear_tool_inputs": ["Bash"]}]}})
    assert full.edits == (ClearToolUses(Threshold("input_tokens", 6000), 2, 500, frozenset({"Read"}),
                                        frozenset({"Bash"})),)
    assert decode_context_management({"context_management": {"edits": [
        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}}]}}).edits == (
        ClearThinking(keep=2),)


BAD_EDITS = {
    "unknown type": {"type": "clear_everything"},
    "trigger unit": {"type": "clear_tool_uses_20250919", "trigger": {"type": "messages", "value": 3}},
    "trigger value": {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 0}},
    "keep unit": {"type": "clear_tool_uses_20250919", "keep": {"type": "input_tokens", "value": 3}},
    "keep negative": {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}},
    "clear_at_least": {"type": "clear_tool_uses_20250919", "clear_at_least": {"type": "tool_uses", "value": 1}},
    "exclude_tools": {"type": "clear_tool_uses_20250919", "exclude_tools": "Read"},
    "clear_tool_inputs": {"type": "clear_tool_uses_20250919", "clear_tool_inputs": "yes"},
    "thinking keep": {"type": "clear_thinking_20251015", "keep": "some"},
    "compact unit": {"type": "compact_20260112", "trigger": {"type": "tool_uses", "value": 5}},
    "value type": {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": "6K"}},
}


@pytest.mark.parametrize("name", sorted(BAD_EDITS))
def test_bad_edit_specs_are_invalid_requests(name):
    with pytest.raises(InvalidRequest):
        decode_context_management({"context_management": {"edits": [BAD_EDITS[name]]}})


def test_an_edit_listed_twice_is_refused():
    with pytest.raises(InvalidRequest, match="twice"):
        decode_context_management({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}] * 2}})


# -- the answer, through the official SDK ---------------------------------------------------------------------


def sdk_session(turns: int) -> list[dict]:
    messages = [{"role": "user", "content": "fix the bug"}]
    for t in range(turns):
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{t}", "name": "sh", "input": {"cmd": f"run {t}"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{t}", "content": " ".join(["out"] * RESULT_WORDS)}]})
    return messages


CLEAR_EDIT = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 500},
                         "keep": {"type": "tool_uses", "value": 1}}]}
TOOLS = [{"name": "sh", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]


def test_applied_edits_in_the_message_and_the_stream(claude, engine):
    message = claude.beta.messages.create(model=MODEL, max_tokens=16, messages=sdk_session(8), tools=TOOLS,
                                          context_management=CLEAR_EDIT)
    applied = message.context_management.applied_edits
    assert [(a.type, a.cleared_tool_uses) for a in applied] == [("clear_tool_uses_20250919", 7)]
    assert applied[0].cleared_input_tokens == 7 * (RESULT_WORDS - len(PLACEHOLDER.split()))
    contents = [m.content for m in engine.submitted[-1].messages if m.role == "tool"]
    assert contents.count(PLACEHOLDER) == 7

    events = list(claude.beta.messages.create(model=MODEL, max_tokens=16, messages=sdk_session(8), tools=TOOLS,
                                              context_management=CLEAR_EDIT, stream=True))
    last_delta = [e for e in events if e.type == "message_delta"][-1]
    assert last_delta.context_management.applied_edits[0].cleared_tool_uses == 7


def test_edits_that_clear_nothing_answer_an_empty_list_and_no_field_without_edits(claude):
    message = claude.beta.messages.create(model=MODEL, max_tokens=16, messages=sdk_session(1), tools=TOOLS,
                                          context_management=CLEAR_EDIT)
    assert message.context_management.applied_edits == []
    assert claude.beta.messages.create(model=MODEL, max_tokens=16, messages=sdk_session(1),
                                       tools=TOOLS).context_management is None


def test_a_bad_edit_is_a_400_in_anthropics_shape(claude):
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.beta.messages.create(model=MODEL, max_tokens=16, messages=sdk_session(1),
                                    context_management={"edits": [{"type": "clear_tool_uses_20250919",
                                                                   "keep": {"type": "tool_uses", "value": -2}}]})
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "keep.value" in body["error"]["message"]


# -- compaction (compact_20260112): the served model's summary, the shared summariser --------------------------

COMPACT = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 20}}]}
LONG_TASK = [{"role": "user", "content": " ".join(["word"] * 40)}]


def test_compaction_summarises_then_answers_from_the_summary(claude, engine):
    engine.script(text_events("The user wants", " words.")).script(text_events("Done."))
    message = claude.beta.messages.create(model=MODEL, max_tokens=16, system="Be brief.", messages=LONG_TASK,
                                          context_management=COMPACT)
    assert [(b.type, getattr(b, "content", None) or getattr(b, "text", None)) for b in message.content] == [
        ("compaction", "The user wants words."), ("text", "Done.")]
    summary_turn, answer_turn = engine.submitted
    assert summary_turn.messages[-1] == Message("user", SUMMARY_PROMPT)  # the Responses compaction's summariser
    assert answer_turn.messages == (Message("system", "Be brief."), summary_message("The user wants words."))
    assert any(note.startswith("context edit:") and "compacted" in note for note in answer_turn.notes)


def test_compaction_streams_its_block_first(claude, engine):
    engine.script(text_events("SUM")).script(text_events("Done."))
    events = list(claude.beta.messages.create(model=MODEL, max_tokens=16, messages=LONG_TASK, stream=True,
                                              context_management=COMPACT))
    starts = [(e.index, e.content_block.type) for e in events if e.type == "content_block_start"]
    assert starts == [(0, "compaction"), (1, "text")]
    assert [e.delta.content for e in events if e.type == "content_block_delta" and e.index == 0] == ["SUM"]


def test_pause_after_compaction_answers_the_summary_alone(claude, engine):
    engine.script(text_events("SUM"))
    pause = {"edits": [{**COMPACT["edits"][0], "pause_after_compaction": True, "instructions": "Summarise."}]}
    message = claude.beta.messages.create(model=MODEL, max_tokens=16, messages=LONG_TASK, context_management=pause)
    assert ([b.type for b in message.content], message.content[0].content, message.stop_reason) == (
        ["compaction"], "SUM", "compaction")
    assert len(engine.submitted) == 1 and engine.submitted[0].messages[-1] == Message("user", "Summarise.")
    events = list(claude.beta.messages.create(model=MODEL, max_tokens=16, messages=LONG_TASK, stream=True,
                                              context_management=pause))
    assert [e.delta.stop_reason for e in events if e.type == "message_delta"] == ["compaction"]


def test_below_the_trigger_nothing_is_compacted(claude, engine):
    message = claude.beta.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}],
                                          context_management=COMPACT)
    assert [b.type for b in message.content] == ["text"] and len(engine.submitted) == 1


def test_a_compaction_block_sent_back_drops_what_came_before_it(claude, engine):
    messages = [*LONG_TASK,
                {"role": "assistant", "content": [{"type": "text", "text": "dropped"},
                                                  {"type": "compaction", "content": "SUM"},
                                                  {"type": "text", "text": "Done."}]},
                {"role": "user", "content": "next"}]
    claude.beta.messages.create(model=MODEL, max_tokens=16, system="Be brief.", messages=messages)
    assert engine.submitted[-1].messages == (Message("system", "Be brief."), summary_message("SUM"),
                                             Message("assistant", "Done."), Message("user", "next"))
    failed = [*LONG_TASK, {"role": "assistant", "content": [{"type": "compaction", "content": None},
                                                            {"type": "text", "text": "Done."}]}]
    claude.beta.messages.create(model=MODEL, max_tokens=16, messages=[*failed, {"role": "user", "content": "n"}])
    assert engine.submitted[-1].messages[0] == Message("user", LONG_TASK[0]["content"])  # null content: a no-op
