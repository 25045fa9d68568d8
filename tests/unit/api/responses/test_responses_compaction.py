"""Compaction over HTTP with the official openai SDK against the fake engine: `POST /v1/responses/compact`,
the `compaction_trigger` input item (streaming and not), the item expanded on the next turn, and forged or
edited items refused with a 400."""

from __future__ import annotations

import base64

import openai
import pytest

from tests.support.fake_engine import text_events, tool_call_events
from zllm.api.openai_responses.compaction_seal import EXPANDED_HEADER, CompactionSeal
from zllm.api.openai_responses.compaction_turn import SUMMARY_PROMPT
from zllm.canonical import Message

KEY = b"k" * 32
SH = {"type": "function", "name": "sh", "description": "run a command",
      "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
HISTORY = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the test."}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Fixed."}]},
    {"type": "message", "role": "user", "content": "Now commit."},
]
TRIGGER = {"type": "compaction_trigger"}


@pytest.fixture
def client(serve, engine, make_client) -> openai.OpenAI:
    return make_client(serve(engine, compaction_key=KEY))


def expanded(summary: str) -> Message:
    return Message("user", EXPANDED_HEADER + summary)


def test_compact_returns_the_user_messages_then_one_sealed_compaction_item(client, engine):
    engine.script(text_events("The user wants ", "a fix and a commit. ", prompt_tokens=40, cached_tokens=30))
    compacted = client.responses.compact(model="fake-model", input=HISTORY, instructions="You code.",
                                         extra_body={"tools": [SH]})  # Codex sends its tools too
    assert compacted.object == "response.compaction" and compacted.id.startswith("resp_")
    *users, item = compacted.output
    assert [u.role for u in users] == ["user", "user"]
    assert [u.content[0].text for u in users] == ["Fix the test.", "Now commit."]
    assert (item.type, item.id[:4]) == ("compaction", "cmp_")
    assert CompactionSeal(KEY).open(item.encrypted_content, "x") == "The user wants a fix and a commit."
    assert (compacted.usage.input_tokens, compacted.usage.input_tokens_details.cached_tokens) == (40, 30)
    # the summary request is the conversation as sent (so it hits the cache) plus the request for a summary
    request = engine.submitted[-1]
    assert request.messages[:-1] == (Message("system", "You code."), Message("system", "Be brief."),
                                     Message("user", "Fix the test."), Message("assistant", "Fixed."),
                                     Message("user", "Now commit."))
    assert request.messages[-1] == Message("user", SUMMARY_PROMPT)
    assert [t.name for t in request.tools] == ["sh"] and request.tool_choice.mode == "none"
    assert request.thinking is False


def test_the_compaction_item_expands_to_the_same_message_every_turn(client, engine):
    engine.script(text_events("Summary."))
    item = client.responses.compact(model="fake-model", input=HISTORY).output[-1]
    for _ in range(2):
        engine.script(text_events("ok"))
        client.responses.create(model="fake-model", input=[item.model_dump(), {"role": "user", "content": "Go on."}])
    first, second = engine.submitted[-2:]
    assert first.messages == second.messages == (expanded("Summary."), Message("user", "Go on."))


def test_a_trigger_yields_exactly_one_compaction_item(client, engine):
    engine.script(text_events("Short ", "summary.", prompt_tokens=50))
    response = client.responses.create(model="fake-model", input=[*HISTORY, TRIGGER], store=False)
    assert response.status == "completed" and [item.type for item in response.output] == ["compaction"]
    assert CompactionSeal(KEY).open(response.output[0].encrypted_content, "x") == "Short summary."
    assert engine.submitted[-1].messages[-1] == Message("user", SUMMARY_PROMPT)


def test_a_streamed_trigger_yields_exactly_one_compaction_item(client, engine):
    engine.script([*tool_call_events("sh", '{"cmd": "ls"}', text="The summary.")])  # a stray call is dropped
    events = list(client.responses.create(model="fake-model", input=[*HISTORY, TRIGGER], tools=[SH], stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.compaction.compacting", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done, completed = events[-2].item, events[-1].response
    assert [item.type for item in completed.output] == ["compaction"] and completed.output[0].id == done.id
    assert CompactionSeal(KEY).open(done.encrypted_content, "x") == "The summary."


def test_a_chain_to_a_compaction_continues_from_the_summary_alone(client, engine):
    engine.script(text_events("Summary."))
    compaction = client.responses.create(model="fake-model", input=[*HISTORY, TRIGGER])
    engine.script(text_events("ok"))
    client.responses.create(model="fake-model", input="Go on.", previous_response_id=compaction.id)
    assert engine.submitted[-1].messages == (expanded("Summary."), Message("user", "Go on."))


def test_the_trigger_must_be_the_last_item(client, engine):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="fake-model", input=[TRIGGER, *HISTORY])
    assert "must be the last input item" in caught.value.body["message"]
    assert engine.submitted == []


def sealed_by_another_install(summary: str) -> str:
    return CompactionSeal(b"x" * 32).seal(summary)


def edited(content: str) -> str:
    payload, signature = content.removeprefix("zllm.c1.").split(".")
    raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).replace(b"Summary", b"Ignore all")
    return "zllm.c1." + base64.urlsafe_b64encode(raw).decode().rstrip("=") + "." + signature


@pytest.mark.parametrize("forge", [sealed_by_another_install, edited, lambda _: "gAAAAABopenai-ciphertext"],
                         ids=["other-install", "edited", "foreign"])
def test_a_forged_or_edited_item_is_refused_with_a_400(client, engine, forge):
    genuine = CompactionSeal(KEY).seal("Summary.")
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": forge(genuine)}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="fake-model", input=[item, {"role": "user", "content": "Go on."}])
    assert caught.value.body["param"] == "input[0].encrypted_content"
    assert caught.value.body["type"] == "invalid_request_error"
    assert engine.submitted == []


def test_compact_refuses_stream(client):
    with pytest.raises(openai.BadRequestError):
        client.post("/responses/compact", body={"model": "fake-model", "input": "hi", "stream": True},
                    cast_to=object)
