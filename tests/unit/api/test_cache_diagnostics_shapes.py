"""Cache diagnoses in the hosted APIs' shapes, parsed back by the official SDKs' own types."""

from __future__ import annotations

import pytest
from anthropic.types import Message as AnthropicMessage
from openai.types.responses import Response

from zllm.api.cache_diagnostics import anthropic_diagnostics, anthropic_previous_id, responses_diagnostics
from zllm.diagnosis.records import CacheDiagnosis
from zllm.errors import InvalidRequest

MISS = CacheDiagnosis("tools", "msg_1", missed_tokens=80, reusable_tokens=300, divergence=220,
                      segment="tool 1 (Read)", cause="changed_tool_schema", detail="the definition of Read changed")


def anthropic_message(diagnostics: dict | None) -> AnthropicMessage:
    return AnthropicMessage.model_validate({
        "id": "msg_2", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": "end_turn", "stop_sequence": None, "diagnostics": diagnostics,
        "usage": {"input_tokens": 0, "output_tokens": 1}})


@pytest.mark.parametrize(("reason", "kind"), [
    ("model", "model_changed"), ("system", "system_changed"), ("tools", "tools_changed"),
    ("messages", "messages_changed"), ("options", "unavailable"), ("template", "unavailable"),
    ("not_found", "previous_message_not_found"), ("unavailable", "unavailable")])
def test_anthropic_reason_types_parse_in_the_sdk(reason: str, kind: str) -> None:
    diagnosis = CacheDiagnosis(reason, "msg_1", missed_tokens=80, reusable_tokens=300)
    parsed = anthropic_message(anthropic_diagnostics(diagnosis)).diagnostics
    assert parsed.cache_miss_reason.type == kind
    assert getattr(parsed.cache_miss_reason, "cache_missed_input_tokens", None) == (
        80 if kind.endswith("_changed") else None)
    assert parsed.model_extra["zllm"]["reason"] == reason


def test_no_miss_and_the_first_turn_carry_null() -> None:
    assert anthropic_diagnostics(None) is None
    assert anthropic_diagnostics(CacheDiagnosis(None, "msg_1")) is None


def test_anthropic_request_field() -> None:
    assert anthropic_previous_id({}) == (False, None)
    assert anthropic_previous_id({"diagnostics": {"previous_message_id": None}}) == (True, None)
    assert anthropic_previous_id({"diagnostics": {"previous_message_id": "msg_1"}}) == (True, "msg_1")
    with pytest.raises(InvalidRequest, match="diagnostics"):
        anthropic_previous_id({"diagnostics": "msg_1"})


def response(diagnostics: dict) -> Response:
    return Response.model_validate({
        "id": "resp_2", "object": "response", "created_at": 1, "model": "m", "output": [], "tools": [],
        "tool_choice": "auto", "parallel_tool_calls": True, "prompt_cache_diagnostics": diagnostics})


@pytest.mark.parametrize(("diagnosis", "expected"), [
    (MISS, ("cache_miss", "tools_changed")),
    (CacheDiagnosis("system", "r"), ("cache_miss", "input_changed")),
    (CacheDiagnosis("options", "r", detail="the conversation is the same but `response_format` changed"),
     ("cache_miss", "text_format_changed")),
    (CacheDiagnosis("options", "r", detail="the conversation is the same but `thinking` changed"),
     ("cache_miss", "reasoning_effort_changed")),
    (CacheDiagnosis(None, "r"), ("cache_hit", None)),
    (CacheDiagnosis("not_found", "r"), ("comparison_response_not_found", None)),
    (CacheDiagnosis("unavailable", "r"), ("unavailable", None)),
])
def test_responses_diagnostics_parse_in_the_sdk(diagnosis: CacheDiagnosis, expected) -> None:
    parsed = response(responses_diagnostics(diagnosis)).prompt_cache_diagnostics
    assert (parsed.type, getattr(parsed, "reason", None)) == expected
    if parsed.type == "cache_miss":
        assert (parsed.cache_missed_tokens, parsed.comparison_reusable_tokens) == (
            diagnosis.missed_tokens, diagnosis.reusable_tokens)
    assert parsed.model_extra["zllm"]["compared_with"] == "r" or diagnosis is MISS
