"""A Claude-Code-shaped session of 40 tool turns with `clear_tool_uses_20250919` (trigger 6K tokens) on a 16K
window, through the official anthropic SDK over real HTTP to an in-process engine (a tiny random-weight model
over the real Qwen tokenizer, so every count is the real tokenizer's).

Cheap by construction: all 40 turns are counted (`count_tokens` applies the edits as generation does), and only
the few turns around the first activation are generated (1 output token each) to check the prefix cache: the
activation turn re-prefills from the first cleared result, and the turns after it hit the cache again.
"""

from __future__ import annotations

import anthropic
import pytest

from tests.support.http_server import ThreadedServer
from tests.support.tiny_models import tiny_qwen_dir
from zllm.api import create_app
from zllm.engine.torch.loader import load_model
from zllm.runtime.client import LocalEngineClient

MODEL = "tiny"
WINDOW = 16_384
TRIGGER = 6_000
TURNS = 40
BILLING = "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;"
SYSTEM = [{"type": "text", "text": BILLING},
          {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
          {"type": "text", "text": "\nYou are an agent working with the user on a repository.",
           "cache_control": {"type": "ephemeral"}}]
TOOLS = [{"name": "Bash", "description": "Run a shell command.",
          "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                           "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
                           "required": ["command"], "additionalProperties": False}},
         {"name": "Read", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                           "required": ["file_path"]}}]
# what Claude Code sends, plus the tool-use clearing under test
CONTEXT_MANAGEMENT = {"edits": [
    {"type": "clear_thinking_20251015", "keep": "all"},
    {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": TRIGGER},
     "keep": {"type": "tool_uses", "value": 3}, "clear_at_least": {"type": "input_tokens", "value": 1000}}]}


def listing(turn: int) -> str:
    """A tool result of about 400 tokens (Qwen tokenizer): 40 of them overflow the window unless old ones are cleared."""
    return "total 96\n" + "".join(f"-rw-r--r-- 1 dev dev {1000 + 37 * i + turn} Jan {i % 28 + 1:2d} 12:{i:02d} "
                                  f"src/module_{turn}_{i}/handler_{i * turn}.py\n" for i in range(10))


def session(turns: int) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nAttribution for git commits: none.\n</system-reminder>\n"},
        {"type": "text", "text": "find where the handlers are registered"}]}]
    for t in range(turns):
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Let me look at module {t}."},
            {"type": "tool_use", "id": f"toolu_{t:02d}", "name": "Bash",
             "input": {"command": f"ls -la src/module_{t}", "description": "List files"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{t:02d}", "content": listing(t), "is_error": False,
             "cache_control": {"type": "ephemeral"}}]})
    return messages


@pytest.fixture(scope="module")
def served():
    reports = []
    loaded = load_model(tiny_qwen_dir(), device="cpu", dtype="float32", threads=1, context_length=WINDOW)
    engine = LocalEngineClient(loaded, MODEL, 0, dialect="hermes", owns_engine=True, observer=reports.append)
    with ThreadedServer(create_app(engine)) as server:
        yield anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0, timeout=120), reports
    engine.close()


def test_forty_tool_turns_stay_in_the_window_and_hit_the_cache_after_an_edit(served):
    claude, reports = served
    counts = [claude.beta.messages.count_tokens(model=MODEL, system=SYSTEM, tools=TOOLS, messages=session(t),
                                                context_management=CONTEXT_MANAGEMENT) for t in range(1, TURNS + 1)]
    assert counts[-1].context_management.original_input_tokens > WINDOW  # unedited, turn 40 would not fit
    assert all(c.input_tokens < TRIGGER + 600 for c in counts), [c.input_tokens for c in counts]
    # activations: the turns whose edited prompt shrank; a block at a time, several turns apart
    activations = [t + 1 for t in range(1, TURNS) if counts[t].input_tokens < counts[t - 1].input_tokens]
    assert 2 <= len(activations) <= 8 and all(b - a >= 3 for a, b in zip(activations, activations[1:])), activations

    first = activations[0]
    usages = {}
    for turn in (first - 1, first, first + 1, first + 2):
        message = claude.beta.messages.create(model=MODEL, max_tokens=1, system=SYSTEM, tools=TOOLS,
                                              messages=session(turn), context_management=CONTEXT_MANAGEMENT)
        usages[turn] = message.usage
        applied = message.context_management.applied_edits
        assert bool(applied) == (turn >= first)
        if applied:
            assert applied[0].type == "clear_tool_uses_20250919" and applied[0].cleared_tool_uses == first - 3
            assert applied[0].cleared_input_tokens > 1000
        prompt = message.usage.input_tokens + message.usage.cache_read_input_tokens \
            + message.usage.cache_creation_input_tokens
        assert prompt == counts[turn - 1].input_tokens  # count_tokens and generation edit alike
    # the activation changed the prompt at the first cleared result: little of the last turn's prompt is reused
    assert usages[first].cache_read_input_tokens < counts[first - 2].input_tokens // 4
    for turn in (first + 1, first + 2):  # ... and the new prefix serves the next turns
        previous = counts[turn - 2].input_tokens
        assert usages[turn].cache_read_input_tokens > previous - 50, (turn, usages[turn], previous)

    notes = {r.request_id: r.notes for r in reports if r.phase == "finished"}
    edit_notes = [n for notes_of in notes.values() for n in notes_of if n.startswith("context edit")]
    assert any("re-prefilled" in n for n in edit_notes) and any("no re-prefill" in n for n in edit_notes)
