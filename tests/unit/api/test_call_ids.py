"""A tool call's id is the core's; each API only spells it (api/call_ids.py)."""

from __future__ import annotations

from zllm.api.call_ids import ANTHROPIC, OPENAI, shown_call_id
from zllm.ids import tool_call_id


def test_the_core_id_is_shown_as_is_on_openai_apis_and_with_anthropics_prefix():
    core = tool_call_id()
    assert shown_call_id(core, OPENAI) == core
    assert shown_call_id(core, ANTHROPIC) == "toolu_" + core.removeprefix("call_")


def test_an_id_without_a_prefix_is_kept_whole():
    assert shown_call_id("7f3a", ANTHROPIC) == "toolu_7f3a"
    assert shown_call_id("7f3a", OPENAI) == "call_7f3a"
