"""The finish reason is decided once, in the core (runtime/turn_output.py), and every API only spells it.

Each case is real model text run through the real text stage (detokenizer, stop tokens and strings, the
token budget) and the Hermes parser over the tiny Qwen tokenizer; the canonical events that come out are fed
to all four APIs, streamed and not (a non-streaming answer is the stream encoder's frames folded:
api/collect.StreamedAnswer). Every API must report the same ending, and show the same tool call under the
same id.
"""

from __future__ import annotations

import re

import pytest

from tests.support.tiny_models import tiny_qwen_tokenizer
from zllm.api.anthropic_messages.encode import MessagesStreamEncoder
from zllm.api.anthropic_messages.message import MessageBuilder
from zllm.api.collect import StreamedAnswer
from zllm.api.ollama.encode import OllamaStreamEncoder, Timings
from zllm.api.ollama.reply import OllamaReplyBuilder
from zllm.api.openai_chat.completion import ChatCompletionBuilder
from zllm.api.openai_chat.encode import ChatStreamEncoder
from zllm.api.openai_responses.encode import ResponseEventEncoder
from zllm.api.openai_responses.response_object import response_shell
from zllm.api.openai_responses.tools import decode_tools
from zllm.api.openai_responses.turn import TerminalResponse
from zllm.canonical import Event, Finished, FinishReason, Usage
from zllm.dialects.hermes.dialect import HermesJson
from zllm.ids import tool_call_id
from zllm.runtime.detokenizer import IncrementalDetokenizer
from zllm.runtime.output import OutputProcessor
from zllm.runtime.stops import StopTokens
from zllm.runtime.turn_output import TurnOutput

CALL = '<tool_call>\n{"name": "sh", "arguments": {"cmd": "ls"}}\n</tool_call>'
UNCLOSED = '<tool_call>\n{"name": "sh", "arguments": {"cmd": "l'
EOS = "<|im_end|>"

# case → (model output, max_tokens (None: all of it), stop strings, the canonical reason the core decides)
CASES = {
    "eos after a complete call": (CALL + EOS, None, (), FinishReason.TOOL_CALLS),
    "eos inside an unclosed call": (UNCLOSED + EOS, None, (), FinishReason.TOOL_CALLS),
    "length inside a call": (UNCLOSED, "all", (), FinishReason.LENGTH),
    "stop string after a call": (CALL + "\nDONE more", None, ("DONE",), FinishReason.STOP_SEQUENCE),
    "eos after text": ("Hello there." + EOS, None, (), FinishReason.STOP),
}

# canonical reason → (Chat finish_reason, Anthropic stop_reason, Responses status, Ollama done_reason)
SPELLED = {
    FinishReason.TOOL_CALLS: ("tool_calls", "tool_use", "completed", "stop"),
    FinishReason.STOP: ("stop", "end_turn", "completed", "stop"),
    FinishReason.LENGTH: ("length", "max_tokens", "incomplete", "length"),
    FinishReason.STOP_SEQUENCE: ("stop", "stop_sequence", "completed", "stop"),
}


def core_events(text: str, max_tokens: str | None, stops: tuple[str, ...]) -> list[Event]:
    """The canonical events the core produces for a model that writes `text`: the runtime's own text stage
    and turn output, fed one token at a time until they end the turn."""
    tokenizer = tiny_qwen_tokenizer()
    token_ids = tokenizer.encode(text)
    turn = TurnOutput(
        OutputProcessor(IncrementalDetokenizer(tokenizer, skip_special_tokens=False),
                        StopTokens(frozenset({tokenizer.convert_tokens_to_ids(EOS)})), stops,
                        max_tokens=len(token_ids) if max_tokens else len(token_ids) + 1,
                        token_text=lambda token_id: tokenizer.decode([token_id])),
        HermesJson().parser((), thinking=False, new_call_id=tool_call_id))
    events: list[Event] = []
    for token_id in token_ids:
        more, ending = turn.accept(token_id)
        events += more
        if ending is not None:
            usage = Usage(prompt_tokens=5, completion_tokens=turn.completion_tokens)
            return [*events, Finished(ending.reason, usage, stop_sequence=ending.stop_sequence)]
    raise AssertionError("the text stage never ended the turn")


def chat(events: list[Event]) -> tuple[list[str], list[str]]:
    stream = ChatStreamEncoder(completion_id="c", model="m", created=1, include_usage=False)
    chunks = [chunk for event in events for chunk in stream.feed(event) if isinstance(chunk, dict)]
    streamed = [choice["finish_reason"] for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"]]
    streamed_ids = [call["id"] for chunk in chunks for choice in chunk["choices"]
                    for call in choice["delta"].get("tool_calls", []) if "id" in call]
    builder = ChatCompletionBuilder(completion_id="c", model="m", created=1)
    for event in events:
        builder.feed(event)
    choice = builder.result()["choices"][0]
    ids = [call["id"] for call in choice["message"].get("tool_calls", [])]
    return [*streamed, choice["finish_reason"]], [*streamed_ids, *ids]


def anthropic(events: list[Event]) -> tuple[list[str], list[str]]:
    stream = MessagesStreamEncoder(message_id="msg_1", model="m", prompt_tokens=5)
    frames = [frame.data for event in events for frame in stream.feed(event)]
    streamed = [frame["delta"]["stop_reason"] for frame in frames if frame["type"] == "message_delta"]
    streamed_ids = [frame["content_block"]["id"] for frame in frames if frame["type"] == "content_block_start"
                    and frame["content_block"]["type"] == "tool_use"]
    builder = MessageBuilder(MessagesStreamEncoder(message_id="msg_1", model="m", prompt_tokens=5))
    for event in events:
        builder.feed(event)
    message = builder.result()
    ids = [block["id"] for block in message["content"] if block["type"] == "tool_use"]
    return [*streamed, message["stop_reason"]], [*streamed_ids, *ids]


def responses(events: list[Event]) -> tuple[list[str], list[str]]:
    def encoder() -> ResponseEventEncoder:
        shell = response_shell("resp_1", model="m", created_at=1, echo={})
        return ResponseEventEncoder(shell, decode_tools([({"type": "function", "name": "sh"}, "tools[0]")]))

    stream = encoder()
    frames = [frame for event in events for frame in stream.feed(event)]
    streamed_ids = [frame["item"]["call_id"] for frame in frames if frame["type"] == "response.output_item.added"
                    and frame["item"]["type"] == "function_call"]
    answer = StreamedAnswer(encoder(), TerminalResponse())
    for event in events:
        answer.feed(event)
    final = answer.result()
    ids = [item["call_id"] for item in final["output"] if item["type"] == "function_call"]
    return [frames[-1]["response"]["status"], final["status"]], [*streamed_ids, *ids]


def ollama(events: list[Event]) -> tuple[list[str], list[str]]:
    stream = OllamaStreamEncoder(kind="chat", model="m", timings=Timings())
    lines = [line for event in events for line in stream.feed(event)]
    streamed_ids = [call["id"] for line in lines for call in line["message"].get("tool_calls", [])]
    builder = OllamaReplyBuilder(kind="chat", model="m", timings=Timings())
    for event in events:
        builder.feed(event)
    reply = builder.result()
    ids = [call["id"] for call in reply["message"].get("tool_calls", [])]
    return [lines[-1]["done_reason"], reply["done_reason"]], [*streamed_ids, *ids]


@pytest.mark.parametrize("case", list(CASES))
def test_every_api_reports_the_ending_the_core_decided(case):
    text, max_tokens, stops, reason = CASES[case]
    events = core_events(text, max_tokens, stops)
    assert events[-1].reason is reason
    reported = [chat(events)[0], anthropic(events)[0], responses(events)[0], ollama(events)[0]]
    assert reported == [[spelled] * len(values) for spelled, values in zip(SPELLED[reason], reported, strict=True)]


@pytest.mark.parametrize("case", [case for case in CASES if "call" in case])
def test_every_api_shows_the_core_call_id(case):
    text, max_tokens, stops, _ = CASES[case]
    events = core_events(text, max_tokens, stops)
    shown = [*chat(events)[1], *anthropic(events)[1], *responses(events)[1], *ollama(events)[1]]
    # one call, shown by 4 APIs streaming and not
    assert len(shown) == 8 and all(re.fullmatch(r"(call|toolu)_[0-9a-f]{24}", call_id) for call_id in shown)
    assert len({call_id.partition("_")[2] for call_id in shown}) == 1, shown
