"""Cache diagnostics through the official SDKs against a real daemon: Anthropic `diagnostics` and Responses
`prompt_cache_diagnostics` name what changed since the earlier response, and the missed token count is what
zllm's prefix cache actually failed to reuse: the earlier prompt minus this request's cache read."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.integration.conftest import TINY, linked_data_dir
from tests.support.daemon import Daemon

BETA = "cache-diagnosis-2026-04-07"
SYSTEM = "You are a careful coding agent. Answer briefly."
CHANGED_SYSTEM = "You are a careful coding agent. Answer briefly. Today is 2026-12-01 22:40."
BASH = {"name": "Bash", "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
READ = {"name": "Read", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
CHANGED_READ = {**READ, "description": "Read a file from the workspace."}
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def daemon(tiny_data_dir, tmp_path_factory):
    data_dir = linked_data_dir(tiny_data_dir, tmp_path_factory.mktemp("diagnostics"))
    proc = Daemon(data_dir, TINY, "--context-length", "1024").wait_ready()
    yield proc
    proc.stop()


@pytest.fixture()
def claude(daemon: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.base_url, api_key="test-key", max_retries=0, timeout=60)


@pytest.fixture()
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="test-key", max_retries=0, timeout=60)


def prompt_size(usage) -> int:
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def turn(claude: anthropic.Anthropic, previous: str | None, *, system: str, tools: list, messages: list,
         stream: bool = False):
    kwargs = {"model": TINY, "max_tokens": 4, "system": system, "tools": tools, "messages": messages,
              "diagnostics": {"previous_message_id": previous}, "betas": [BETA], "extra_body": GREEDY}
    if not stream:
        return claude.beta.messages.create(**kwargs)
    with claude.beta.messages.stream(**kwargs) as events:
        start = next(event for event in events if event.type == "message_start")
        final = events.get_final_message()
    assert start.message.diagnostics == final.diagnostics  # message_start carries it already
    return final


def reason(message):
    assert message.diagnostics is not None, "a miss was expected"
    return message.diagnostics.cache_miss_reason, message.diagnostics.model_extra["zllm"]


def history(first_user: str, turns: int = 0) -> list:
    """A conversation `turns` exchanges long. The assistant turns are fixed text, not what the random-weight
    model said: what it writes may start with whitespace that re-tokenizes with the template's newline, and
    that is a template divergence, not what these tests are about."""
    messages = [{"role": "user", "content": first_user}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": f"Done {i}."}, {"role": "user", "content": f"Next {i}."}]
    return messages


def test_anthropic_names_the_changed_part_and_the_tokens_the_cache_missed(claude, daemon) -> None:
    first = turn(claude, None, system=SYSTEM, tools=[BASH, READ], messages=history("List the files."))
    assert first.diagnostics is None  # the first turn opts in; nothing to compare

    # a changed tool: the cache reuses the prompt up to that tool's description
    second = turn(claude, first.id, system=SYSTEM, tools=[BASH, CHANGED_READ],
                  messages=history("List the files.", 1))
    miss, zllm = reason(second)
    assert miss.type == "tools_changed"
    assert miss.cache_missed_input_tokens == prompt_size(first.usage) - second.usage.cache_read_input_tokens > 0
    assert (zllm["segment"], zllm["cause"]) == ("tool 1 (Read)", "changed_tool_schema")
    assert zllm["token_index"] == second.usage.cache_read_input_tokens

    # a changed system prompt (streamed: message_start says it)
    third = turn(claude, second.id, system=CHANGED_SYSTEM, tools=[BASH, CHANGED_READ],
                 messages=history("List the files.", 2), stream=True)
    miss, zllm = reason(third)
    assert miss.type == "system_changed"
    assert miss.cache_missed_input_tokens == prompt_size(second.usage) - third.usage.cache_read_input_tokens > 0
    assert zllm["segment"] == "system"

    # an earlier message edited
    fourth = turn(claude, third.id, system=CHANGED_SYSTEM, tools=[BASH, CHANGED_READ],
                  messages=history("List the Python files.", 3))
    miss, zllm = reason(fourth)
    assert miss.type == "messages_changed"
    assert miss.cache_missed_input_tokens == prompt_size(third.usage) - fourth.usage.cache_read_input_tokens > 0
    assert (zllm["segment"], zllm["cause"]) == ("message 1 (user)", "edited_history")

    # only appended: no miss, no diagnostics
    fifth = turn(claude, fourth.id, system=CHANGED_SYSTEM, tools=[BASH, CHANGED_READ],
                 messages=history("List the Python files.", 4))
    assert fifth.diagnostics is None
    assert fifth.usage.cache_read_input_tokens >= prompt_size(fourth.usage) - 1

    unknown = turn(claude, "msg_unknown", system=SYSTEM, tools=[BASH], messages=history("Hi."))
    assert reason(unknown)[0].type == "previous_message_not_found"

    # `zllm cache explain-miss --id` reads the same diagnosis over the control socket
    kept = daemon.control().diagnosis(second.id)["diagnosis"]
    assert (kept["reason"], kept["segment"], kept["missed_tokens"]) == (
        "tools", "tool 1 (Read)", second.diagnostics.cache_miss_reason.cache_missed_input_tokens)


def test_anthropic_usage_splits_the_prompt_into_read_and_newly_kept(claude) -> None:
    messages = history("Count to three.")
    cold = claude.messages.create(model=TINY, max_tokens=2, system="Be terse, really.", messages=messages,
                                  extra_body=GREEDY)
    # read: the template's opening tokens that every cached prompt shares; the rest is prefilled and kept
    assert cold.usage.cache_read_input_tokens < 5 and cold.usage.input_tokens == 0
    assert cold.usage.cache_creation_input_tokens == prompt_size(cold.usage) - cold.usage.cache_read_input_tokens
    warm = claude.messages.create(model=TINY, max_tokens=2, system="Be terse, really.",
                                  messages=[*messages, {"role": "assistant", "content": "one"},
                                            {"role": "user", "content": "Go on."}], extra_body=GREEDY)
    assert warm.usage.cache_read_input_tokens > 0
    assert warm.usage.cache_creation_input_tokens == prompt_size(warm.usage) - warm.usage.cache_read_input_tokens
    assert warm.usage.input_tokens == 0


def respond(client: openai.OpenAI, compared: str | None, *, instructions: str, tools: list, messages: list):
    extra = {"prompt_cache_options": {"comparison_response_id": compared}} if compared else {}
    return client.responses.create(model=TINY, instructions=instructions, max_output_tokens=4, temperature=0,
                                   tools=[{"type": "function", "name": t["name"], "description": t["description"],
                                           "parameters": t["input_schema"]} for t in tools],
                                   input=messages, **extra)


def test_responses_prompt_cache_diagnostics(client) -> None:
    # other instructions than the Anthropic test's: the APIs share cache entries, and these counts must come
    # from this conversation's own
    system, changed_system = "Responses: " + SYSTEM, "Responses: " + CHANGED_SYSTEM
    first = respond(client, None, instructions=system, tools=[BASH, READ], messages=history("List the files."))
    assert first.prompt_cache_diagnostics is None

    second = respond(client, first.id, instructions=system, tools=[BASH, CHANGED_READ],
                     messages=history("List the files.", 1))
    diagnostics = second.prompt_cache_diagnostics
    assert (diagnostics.type, diagnostics.reason) == ("cache_miss", "tools_changed")
    assert diagnostics.cache_missed_tokens == (first.usage.input_tokens
                                               - second.usage.input_tokens_details.cached_tokens) > 0
    assert diagnostics.comparison_reusable_tokens == first.usage.input_tokens
    details = second.usage.input_tokens_details  # what was not read is prefilled and kept for the next turn
    assert details.cache_write_tokens == second.usage.input_tokens - details.cached_tokens > 0
    assert second.prompt_cache_options.comparison_response_id == first.id
    assert diagnostics.model_extra["zllm"]["segment"] == "tool 1 (Read)"

    third = respond(client, second.id, instructions=changed_system, tools=[BASH, CHANGED_READ],
                    messages=history("List the files.", 2))
    diagnostics = third.prompt_cache_diagnostics
    assert (diagnostics.type, diagnostics.reason) == ("cache_miss", "input_changed")
    assert diagnostics.cache_missed_tokens == (second.usage.input_tokens
                                               - third.usage.input_tokens_details.cached_tokens) > 0
    assert diagnostics.model_extra["zllm"]["segment"] == "system"

    fourth = respond(client, third.id, instructions=changed_system, tools=[BASH, CHANGED_READ],
                     messages=history("List the files.", 3))
    assert fourth.prompt_cache_diagnostics.type == "cache_hit"

    unknown = respond(client, "resp_unknown", instructions=system, tools=[BASH], messages=history("Hi."))
    assert unknown.prompt_cache_diagnostics.type == "comparison_response_not_found"


def test_bad_diagnostics_fields_are_answered_in_each_api_shape(claude, client) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=TINY, max_tokens=2, messages=history("Hi."),
                               extra_body={"diagnostics": {"previous_message_id": 42}})
    assert "diagnostics.previous_message_id" in str(caught.value)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=TINY, input="Hi.", max_output_tokens=2,
                                extra_body={"prompt_cache_options": "resp_1"})
    assert "prompt_cache_options" in str(caught.value)


def test_claude_codes_busters_are_normalized_or_reported_on_every_api_path(claude, client, daemon) -> None:
    def header(session: str) -> str:
        return f"x-anthropic-billing-header: cc_version=2.1.340.{session}; cc_entrypoint=cli; cch={session}f0;"

    reminder = "<system-reminder>\n51,000 tokens left\n</system-reminder>"
    anthropic_body = {"model": TINY, "max_tokens": 2, "extra_body": GREEDY,
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "Fix the bug."},
                                                                {"type": "text", "text": reminder}]}]}
    first = claude.messages.create(system=[{"type": "text", "text": header("0b8")},
                                           {"type": "text", "text": "Busters: be brief."}], **anthropic_body)
    # another session's header: the prompt is the same, so the whole of it but the last token is reused
    second = claude.messages.create(system=[{"type": "text", "text": header("6ff")},
                                            {"type": "text", "text": "Busters: be brief."}], **anthropic_body)
    assert prompt_size(second.usage) == prompt_size(first.usage)
    assert second.usage.cache_read_input_tokens == prompt_size(first.usage) - 1
    chat = client.chat.completions.create(model=TINY, max_tokens=2, temperature=0, messages=[
        {"role": "system", "content": header("28c") + "\nBusters: be brief."},
        {"role": "user", "content": "Fix the bug.\n" + reminder}])
    details = chat.usage.prompt_tokens_details  # the same prompt a third time: all of it but the last token read
    assert (details.cached_tokens, details.cache_write_tokens) == (chat.usage.prompt_tokens - 1, 1)
    reports = [r for r in daemon.control().trace(last=3) if r.get("phase") == "finished"][-3:]
    for report in reports:  # the trace says what was dropped and what was kept, whichever API it came through
        assert any(note.startswith("dropped per-session line: x-anthropic-billing-header") for note in report["notes"])
        assert any(note.startswith("trailing tokens-left reminder in message 1") for note in report["notes"])
    assert [r["api"] for r in reports] == ["anthropic_messages", "anthropic_messages", "openai_chat"]
