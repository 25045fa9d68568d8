"""The rendered prompt cut into named segments: contiguous, in prompt order, each tool's schema its own."""

from __future__ import annotations

from zllm.canonical import ChatRequest, FunctionTool, Message, ToolCall
from zllm.diagnosis.segments import map_segments

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = (FunctionTool("Bash", "Run a command", SCHEMA), FunctionTool("Read", "Read a file", SCHEMA),
         FunctionTool("Grep", "Search files", SCHEMA))
AGENT = ChatRequest(id="r", model="m", tools=TOOLS, messages=(
    Message("system", "You are terse."),
    Message("user", "List files."),
    Message("assistant", "", tool_calls=(ToolCall("c1", "Bash", '{"command": "ls"}'),)),
    Message("tool", "a.txt", tool_call_id="c1", name="Bash"),
    Message("user", "Thanks."),
))


def texts(renderer, request: ChatRequest) -> list[tuple[str, str]]:
    ids = renderer.render(request).token_ids
    return [(s.name, renderer.tokenizer.decode(list(ids[s.start:s.stop])))
            for s in map_segments(renderer, request).segments]


def test_segments_name_the_system_block_each_tool_each_message_and_the_generation_prompt(renderer) -> None:
    runs = texts(renderer, AGENT)
    assert [name for name, _ in runs] == [
        "system block", "tools", "tool 0 (Bash)", "tool 1 (Read)", "tool 2 (Grep)", "tools", "system block",
        "message 1 (user)", "message 2 (assistant tool call)", "message 3 (tool result)", "message 4 (user)",
        "generation prompt"]
    by_name = dict(runs)
    for i, tool in enumerate(TOOLS):  # each schema run is exactly that tool's JSON line
        text = by_name[f"tool {i} ({tool.name})"]
        assert text.startswith('{"type": "function"') and f'"name": "{tool.name}"' in text
        assert text.rstrip().endswith("}}") and text.count('"name"') == 1
    assert "List files." in by_name["message 1 (user)"]
    assert by_name["generation prompt"] == "<|im_start|>assistant\n"


def test_segments_cover_the_rendered_prompt_exactly(renderer) -> None:
    total = len(renderer.render(AGENT).token_ids)
    segments = map_segments(renderer, AGENT)
    assert segments.total == total and sum(s.tokens for s in segments.segments) == total
    assert segments.at(0).name == "system block" and segments.at(total - 1).name == "generation prompt"
    assert segments.at(total) is None


def test_one_tool_owns_the_whole_tool_text(renderer) -> None:
    request = ChatRequest(id="r", model="m", tools=TOOLS[:1], messages=(Message("user", "hi"),))
    names = [name for name, _ in texts(renderer, request)]
    assert "tool 0 (Bash)" in names and "tools" not in names


def test_a_dropped_billing_header_owns_no_tokens_and_numbering_follows_the_request(renderer) -> None:
    request = ChatRequest(id="r", model="m", messages=(
        Message("system", "x-anthropic-billing-header: cc_version=1;"), Message("user", "hi")))
    assert [name for name, _ in texts(renderer, request)] == ["message 1 (user)", "generation prompt"]
