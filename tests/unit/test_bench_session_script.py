"""bench/session_script.py: the session benchmark's conversation is Claude-Code-shaped and one growing prefix."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from zllm.api.anthropic_messages.decode import decode_messages_request

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "session_script.py"
_spec = importlib.util.spec_from_file_location("session_script", SCRIPT)
session_script = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("session_script", session_script)  # its dataclass looks its module up
_spec.loader.exec_module(session_script)

# the shape of a recorded Claude Code agent request (bench/claude_code_request.py), cut down
RECORDED = {
    "model": "some-model", "max_tokens": 32000, "stream": True, "thinking": {"type": "adaptive"},
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.8eb; cc_entrypoint=sdk-cli;"},
               {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
               {"type": "text", "text": "\n".join(f"Rule {i}: keep changes small." for i in range(60)),
                "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>date</system-reminder>"},
                                              {"type": "text", "text": "Make update() faster."}]},
                 {"role": "system", "content": "Available agent types: " + "x" * 600}],
    "tools": [{"name": name, "description": f"{name} " * 80, "input_schema": {"type": "object"}}
              for name in ("Agent", "Bash", "Edit", "Read", "Workflow", "Write")],
}


def main_bodies(steps) -> list[dict]:
    return [step.body for step in steps if step.kind in ("main", "echo")]


def test_main_turns_grow_one_prefix_with_an_echo_turn_and_one_restart_in_the_middle() -> None:
    steps = session_script.session_steps(RECORDED, turns=8)
    kinds = [step.kind for step in steps]
    assert kinds.count("main") + kinds.count("echo") == 8 and kinds.count("echo") == 1
    assert kinds.count("restart") == 1
    assert [s.kind for s in steps[:kinds.index("restart")]].count("main") == 4
    bodies = main_bodies(steps)
    for earlier, later in zip(bodies, bodies[1:]):
        # the same system and tools every turn; the history only grows (breakpoints move, as Claude Code's do)
        assert (later["system"], later["tools"]) == (earlier["system"], earlier["tools"])
        assert len(later["messages"]) > len(earlier["messages"])
        strip = session_script.without_breakpoints
        assert strip(later["messages"][:len(earlier["messages"])]) == strip(earlier["messages"])
    echo = next(step.body for step in steps if step.kind == "echo")
    assert echo["max_tokens"] == session_script.ECHO_MAX_TOKENS
    read_back = echo["messages"][-1]["content"].split()[1]  # "Write src/cache.py back …"
    last_result = [m for m in echo["messages"] if isinstance(m["content"], list)
                   and m["content"][0].get("type") == "tool_result"][-1]
    assert read_back in json.dumps(echo["messages"][-4])
    assert "def update_cache_0" in last_result["content"][0]["content"]


def test_every_request_is_a_valid_anthropic_body_with_matching_tool_ids() -> None:
    steps = session_script.session_steps(RECORDED, turns=7)
    assert [s.name for s in steps if s.kind == "side"][:2] == ["quota", "title"]
    assert any(s.name.startswith("classifier") for s in steps)
    for step in steps:
        if step.body is None:
            continue
        decode_messages_request(step.body, request_id="r", namespace="ns")  # raises on a malformed body
        uses = [b["id"] for m in step.body["messages"] if isinstance(m["content"], list)
                for b in m["content"] if b.get("type") == "tool_use"]
        results = [b["tool_use_id"] for m in step.body["messages"] if isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result"]
        assert uses == results and len(set(uses)) == len(uses)
        breakpoints = json.dumps(step.body["messages"]).count('"cache_control"')
        assert breakpoints <= 1  # the newest tool_result only


def test_prompt_scale_shortens_texts_and_tools_but_keeps_bash_and_read() -> None:
    full = session_script.scaled(RECORDED, 1.0)
    assert full == RECORDED and full is not RECORDED
    quarter = session_script.scaled(RECORDED, 0.25)
    assert len(json.dumps(quarter)) < 0.5 * len(json.dumps(RECORDED))
    kept = {tool["name"] for tool in quarter["tools"]}
    assert {"Bash", "Read"} <= kept < {tool["name"] for tool in RECORDED["tools"]}
    assert quarter["system"][0] == RECORDED["system"][0]  # short blocks (the billing header) are kept whole
