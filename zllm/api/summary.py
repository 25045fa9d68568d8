"""The summary that replaces a conversation's history, written by the served model: one summariser for every
API's compaction (Responses `compaction` items, openai_responses/compaction_turn.py; Anthropic's `compact_20260112`
edit, anthropic_messages/compaction.py).

    request = summary_request(turn)                 # the turn's own prompt + one user message asking for it
    summary = await write_summary(engine, request)  # its text (stripped) and the Finished usage

The summary request is the conversation as the client sent it (same system prompt, tools and history, so its
prompt is the last turn's prompt and comes from the prefix cache) plus one user message asking for the summary;
no tool is called and no reasoning is asked for. A compacted conversation shows the summary as one user message
under a fixed header (`summary_message`): the same text for the same summary every turn, so the compacted
prefix hits the prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zllm.api.collect import raise_unless_completed, run_to_finish
from zllm.canonical import ChatRequest, EngineClient, Message, TextDelta, ToolChoice, Usage

# enough for a dense summary, small next to the windows agents run with
SUMMARY_MAX_TOKENS = 1024
SUMMARY_PROMPT = (
    "Stop here and write a summary of this conversation for yourself, to continue from it later with "
    "nothing else: what the user asked for and every constraint they gave, what has been done (files, "
    "commands, results, decisions), what is still to do, and anything you need to remember. Write the "
    "summary only, as plain text; call no tools.")
EXPANDED_HEADER = ("This conversation was compacted: what came before it is replaced by this summary of it, "
                   "written earlier by you. Continue the work from here.\n\n")


@dataclass(frozen=True)
class Summary:
    text: str
    usage: Usage


def summary_request(turn: ChatRequest, *, max_tokens: int | None = None, instructions: str | None = None,
                    request_id: str | None = None) -> ChatRequest:
    """`turn` asked to summarise itself instead (`instructions`: the client's prompt, replacing ours)."""
    sampling = replace(turn.sampling, max_tokens=max_tokens or SUMMARY_MAX_TOKENS)
    return replace(turn, id=request_id or turn.id,
                   messages=(*turn.messages, Message("user", instructions or SUMMARY_PROMPT)),
                   sampling=sampling, tool_choice=ToolChoice(mode="none"), thinking=False, response_format=None)


async def write_summary(engine: EngineClient, request: ChatRequest) -> Summary:
    stream = await engine.submit(request)
    pieces: list[str] = []
    finished = raise_unless_completed(await run_to_finish(
        stream, lambda event: pieces.append(event.text) if isinstance(event, TextDelta) else None))
    return Summary("".join(pieces).strip(), finished.usage)


def summary_message(summary: str) -> Message:
    return Message("user", EXPANDED_HEADER + summary)
