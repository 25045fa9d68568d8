"""The round-trip check a dialect passes at load and in `zllm dialect`: render, parse its own output, render again.

    result = check_round_trip(dialect, template, encode=tokenizer_encode, end_texts=("<|im_end|>",))
    result.held, result.problem, result.sample   # True, "", '<tool_call>\\n{"name": "get_weather", ...'
    result.text_turn                             # "" where a turn of text continues the cache too, else what forks

A probe conversation (two tools; a user turn; an assistant turn with reasoning where the family has it and two
calls; their two results) is rendered as the next turn's prompt. Its assistant turn, cut out of that prompt where
this turn's prompt ends and the turn's end marker begins, is what the model would have written; the dialect's own
parser reads it back, and the conversation rendered again with what was read must give the same tokens. That is
the guarantee the prefix cache lives on (turn N+1's prompt starts with turn N's prompt and output), checked on
this model's template and tokenizer rather than on the test suite's. A check that fails says what breaks; the
model is still served (the calls may still work, the cache forks at the first call).

A turn of text is checked the same way (`text_turn`), under each reasoning setting the family has: a template that
renders a text turn otherwise than its generation prompt began it (Command R7B's prompt closes an empty plan,
`<|START_THINKING|><|END_THINKING|>`, that its text turns never write) forks the cache after every answer, whatever
the dialect does; said, not silent, and the calls' round trip is judged apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from zllm.canonical import (
    FunctionTool,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
    with_form,
)
from zllm.dialects.base import ChatTemplate, Conversation, Dialect, canonical_arguments

PROBE_TOOLS = (
    FunctionTool("get_weather", "Weather for a city",
                 {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    FunctionTool("search", "Search the web",
                 {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
                                                   "exact": {"type": "boolean"}},
                  "required": ["query"]}),
)
PROBE_CALLS = (
    ToolCall("call_probe0", "get_weather", '{"city": "Paris"}'),
    ToolCall("call_probe1", "search", '{"query": "news today", "limit": 3, "exact": true}'),
)
_USER = Message("user", "What is the weather in Paris, and the news?")
_REASONING = "The user wants two things: I will call both tools."
_ANSWER = "It is sunny in Paris, 21 C; nothing new in the news."
_FOLLOW_UP = Message("user", "Thanks. And tomorrow?")
_RESULTS = (Message("tool", "sunny, 21 C", tool_call_id="call_probe0", name="get_weather"),
            Message("tool", "nothing new", tool_call_id="call_probe1", name="search"))


@dataclass(frozen=True)
class RoundTrip:
    held: bool
    problem: str = ""  # what breaks, in a sentence ("" when it held)
    sample: str = ""  # one call as the model writes it (the probe's first call alone, as rendered)
    text_turn: str = ""  # what forks the cache after a turn of text ("" where it continues)
    # the fork lies after the last user message (a turn's reasoning or an empty plan left out: Qwen3, GLM, gpt-oss,
    # Command R7B, ...): the next turn prefills that answer again, the conversation before it still comes from cache
    text_turn_costs_only_the_answer: bool = False


def check_round_trip(dialect: Dialect, template: ChatTemplate | None, *, encode: Callable[[str], Sequence[int]],
                     end_texts: Sequence[str] = ()) -> RoundTrip:
    """`encode`: prompt text → token ids (text compared as is when a caller has no tokenizer: `list`);
    `end_texts`: what may end an assistant turn in the prompt (EOS / end-of-turn token text).
    Checked with reasoning where the family has it; a family that does not reason by default and whose template
    drops reasoning it was given (DeepSeek V3.1) holds when its default, reasoning off, does."""
    result = _check(dialect, template, encode, end_texts, thinking=dialect.supports_thinking)
    if not result.held and dialect.supports_thinking and not dialect.thinking_default:
        plain = _check(dialect, template, encode, end_texts, thinking=False)
        if plain.held:
            result = plain
    # a turn of text ends at the marker that closes it too where that marker opens calls (GigaChat 3's
    # `<|message_sep|>`: the parser drops it after text; it stops generation where no call can follow)
    ends = (*_ends(dialect, end_texts), *dialect.ends_text_turn)
    text_turn, answer_only = _text_turn_forks(dialect, template, encode, ends)
    return replace(result, text_turn=text_turn, text_turn_costs_only_the_answer=answer_only)


def _ends(dialect: Dialect, end_texts: Sequence[str]) -> tuple[str, ...]:
    # what ends a message only (harmony's `<|end|>`, though Phi-3 ends a turn with it) does not end the turn
    return tuple(end for end in (*end_texts, *dialect.end_of_turn) if end not in dialect.continues_turn)


def _text_turn_forks(dialect: Dialect, template: ChatTemplate | None, encode: Callable[[str], Sequence[int]],
                     ends: Sequence[str]) -> tuple[str, bool]:
    """What forks the cache after an assistant turn of text ("" where nothing does), and whether the fork lies
    after the last user message: checked under the family's default reasoning setting and, where it reasons, the
    other one too."""
    settings = dict.fromkeys((dialect.thinking_default, *((not dialect.thinking_default,)
                                                          if dialect.supports_thinking else ())))
    for thinking in settings:
        try:
            problem = _text_turn_problem(dialect, template, encode, ends, thinking)
        except Exception as exc:  # noqa: BLE001 - a template that rejects the probe: said like a fork
            problem = f"the probe conversation does not render: {exc}"
        if problem:
            setting = f" with reasoning {'on' if thinking else 'off'}" if dialect.supports_thinking else ""
            return (f"after a turn of text{setting}, {problem}: the prefix cache forks at each answer",
                    _fork_after_the_user_message(dialect, template, thinking))
    return "", False


def _text_turn(thinking: bool) -> Message:
    return Message("assistant", _ANSWER, reasoning=_REASONING if thinking else None)


def _fork_after_the_user_message(dialect: Dialect, template: ChatTemplate | None, thinking: bool) -> bool:
    """Whether this prompt and the next agree past the user's message (so a fork there costs the answer alone)."""
    try:
        prompt = _render(dialect, template, (_USER,), thinking)
        following = _render(dialect, template, (_USER, _text_turn(thinking), _FOLLOW_UP), thinking)
    except Exception:  # noqa: BLE001 - a template that rejects the probe: no better than a fork anywhere
        return False
    agreed = next((i for i, (x, y) in enumerate(zip(prompt, following)) if x != y), min(len(prompt), len(following)))
    user_end = prompt.find(_USER.content)
    return user_end >= 0 and user_end + len(_USER.content) <= agreed


def _text_turn_problem(dialect: Dialect, template: ChatTemplate | None, encode: Callable[[str], Sequence[int]],
                       ends: Sequence[str], thinking: bool) -> str:
    turn = _text_turn(thinking)
    prompt = _render(dialect, template, (_USER,), thinking)
    following = _render(dialect, template, (_USER, turn, _FOLLOW_UP), thinking)
    dropped = thinking and _REASONING not in following
    if not following.startswith(prompt):
        return f"the next prompt does not start with this one (the template rewrites the conversation" \
               f"{' and drops its reasoning' if dropped else ''}: {_context(prompt, following)})"
    if dropped:
        return "the template drops the turn's reasoning from the next prompt"
    read = _parse(dialect, _cut_at_end(following[len(prompt):], ends), thinking)
    if read.tool_calls or read.content.strip() != _ANSWER:
        return f"the parser reads the turn back as {read.content.strip()[:60]!r} and {len(read.tool_calls)} calls"
    again = _render(dialect, template, (_USER, read, _FOLLOW_UP), thinking)
    if list(encode(following)) != list(encode(again)):
        return f"rendering the text read back changes the prompt ({_context(following, again)})"
    return ""


def _check(dialect: Dialect, template: ChatTemplate | None, encode: Callable[[str], Sequence[int]],
           end_texts: Sequence[str], *, thinking: bool) -> RoundTrip:
    ends = _ends(dialect, end_texts)
    try:
        sample = _sample_call(dialect, template, ends)
        prompt = _render(dialect, template, (_USER,), thinking)
        turn, results, following = _calling_turn(dialect, template, thinking)
    except Exception as exc:  # a template that rejects the probe: nothing else can be checked
        return RoundTrip(False, f"the probe conversation does not render: {exc}")
    block = getattr(dialect, "after_last_message", "")
    if block and not following.startswith(prompt) and _continued(dialect, prompt) != prompt:
        return _check_moved_block(dialect, template, encode, ends, thinking, turn, results, following, sample)
    if not following.startswith(prompt):
        return RoundTrip(False, "the next turn's prompt does not start with this turn's prompt (the template "
                                "rewrites the conversation before the calls)", sample)
    output = _cut_at_end(_turn_alone(dialect, template, turn, thinking, following)[len(prompt):], ends)
    read = _parse(dialect, output, thinking)
    problem = _compare_calls(read, turn, thinking)
    if problem:
        return RoundTrip(False, problem, sample)
    again = _render(dialect, template, (_USER, read, *results), thinking)
    first, second = list(encode(following)), list(encode(again))
    if first != second:
        at = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
        where = _context(following, again)
        return RoundTrip(False, f"rendering the calls read back changes the prompt at token {at} ({where}): the "
                                "prefix cache forks at the first tool call", sample)
    return RoundTrip(True, "", sample)


def _continued(dialect: Dialect, prompt: str) -> str:
    """The prompt as the model's turn continues it in the template's rendering: without the block the template
    writes after the last message (derived format.py `after_last`), where it writes one."""
    block = getattr(dialect, "after_last_message", "")
    return prompt.replace(block, "", 1) if block and prompt.count(block) == 1 else prompt


def _check_moved_block(dialect: Dialect, template: ChatTemplate | None, encode: Callable[[str], Sequence[int]],
                       ends: Sequence[str], thinking: bool, turn: Message, results: tuple[Message, ...],
                       following: str, sample: str) -> RoundTrip:
    """A template that writes a block after the last message (Command R+'s `Action:` instruction): no next prompt
    can start with this one, but the calls still read back from the turn as the template writes it (between the
    prompt without the block and the block) and render the same: said, so that a failure of those is told apart."""
    block = dialect.after_last_message
    head = _continued(dialect, _render(dialect, template, (_USER,), thinking))
    alone = dialect.render(Conversation((_USER, turn), PROBE_TOOLS, thinking=thinking, add_generation_prompt=False),
                           template)
    if not (alone.startswith(head) and alone.endswith(block)):
        return RoundTrip(False, "the next turn's prompt does not start with this turn's prompt (the template "
                                "rewrites the conversation before the calls)", sample)
    read = _parse(dialect, _cut_at_end(alone[len(head):len(alone) - len(block)], ends), thinking)
    problem = _compare_calls(read, turn, thinking)
    if problem:
        return RoundTrip(False, problem, sample)
    again = _render(dialect, template, (_USER, read, *results), thinking)
    if list(encode(following)) != list(encode(again)):
        return RoundTrip(False, f"rendering the calls read back changes the prompt ({_context(following, again)})",
                         sample)
    shown = block if len(block) <= 60 else block[:60] + "..."
    return RoundTrip(False, f"the template writes {shown!r} after the last message, and the next turn's prompt moves "
                            "it after the new messages: no prompt starts with the one before, the cache forks at "
                            "each turn (the calls read back and render the same)", sample)


def _calling_turn(dialect: Dialect, template: ChatTemplate | None, thinking: bool):
    """(the probe's assistant turn, its results, the next turn's prompt): two calls, or one where the template
    refuses two in a turn (Llama 3.x raises "only supports single tool-calls")."""
    # a template that writes one call per turn (it refuses a second, or drops it): one
    for count in ((1,) if getattr(dialect, "single_call", False) else (2, 1)):
        turn = Message("assistant", "", tool_calls=PROBE_CALLS[:count], reasoning=_REASONING if thinking else None)
        try:
            return turn, _RESULTS[:count], _render(dialect, template, (_USER, turn, *_RESULTS[:count]), thinking)
        except Exception:
            if count == 1:
                raise
    raise AssertionError("unreachable")


def _turn_alone(dialect: Dialect, template: ChatTemplate | None, turn: Message, thinking: bool,
                following: str) -> str:
    """The next turn's prompt up to the end of the calling turn: the conversation rendered without the results,
    where that is how the next prompt starts (a template that writes no end-of-turn marker of its own, GLM-4.7's
    `</tool_call><|observation|>`, has the results follow the calls directly); else the whole next prompt."""
    try:
        alone = dialect.render(Conversation((_USER, turn), PROBE_TOOLS, thinking=thinking,
                                            add_generation_prompt=False), template)
    except Exception:  # noqa: BLE001 - a template that refuses a conversation ending in calls
        return following
    return alone if following.startswith(alone) else following


def _render(dialect: Dialect, template: ChatTemplate | None, messages: tuple[Message, ...], thinking: bool) -> str:
    return dialect.render(Conversation(messages, PROBE_TOOLS, thinking=thinking), template)


def probe_call_conversation() -> tuple[Message, ...]:
    """The probe's first call alone, and its result: what `sample_call` renders."""
    return (_USER, Message("assistant", "", tool_calls=PROBE_CALLS[:1]), _RESULTS[0])


def _sample_call(dialect: Dialect, template: ChatTemplate | None, ends: Sequence[str]) -> str:
    """The probe's first call alone, as the model would write it (the text between prompt and turn end)."""
    turn = Message("assistant", "", tool_calls=PROBE_CALLS[:1])
    for thinking in dict.fromkeys((False, dialect.thinking_default)):  # Gemma 4 continues its prompt thinking only
        prompt = _render(dialect, template, (_USER,), thinking)
        if _continued(dialect, prompt) != prompt:  # the template's block after the last message left out
            alone = dialect.render(Conversation((_USER, turn), PROBE_TOOLS, thinking=thinking,
                                                add_generation_prompt=False), template)
            head, block = _continued(dialect, prompt), dialect.after_last_message
            if alone.startswith(head) and alone.endswith(block):
                return _cut_at_end(alone[len(head):len(alone) - len(block)], ends, dialect.continues_turn)
        following = _render(dialect, template, (_USER, turn, _RESULTS[0]), thinking)
        if following.startswith(prompt):
            return _cut_at_end(following[len(prompt):], ends, dialect.continues_turn)
    return ""


def _cut_at_end(text: str, ends: Sequence[str], continuing: Sequence[str] = ()) -> str:
    """`text` up to its first end; `continuing`: markers that end a message, not the turn, cut only past the
    turn's start (GigaChat 3's `<|message_sep|>` opens its call and closes it: the sample is the call alone)."""
    cuts = [at for at in (text.find(end) for end in ends if end) if at >= 0]
    cuts += [at for at in (text.find(end, 1) for end in continuing if end) if at >= 0]
    return text[:min(cuts)] if cuts else text


def _parse(dialect: Dialect, output: str, thinking: bool) -> Message:
    """The assistant message the dialect's parser reads from `output`; calls keep the probe's ids (the results
    answer them) with the form the parser found."""
    numbers = iter(range(1_000_000))
    parser = dialect.parser(PROBE_TOOLS, thinking=thinking, new_call_id=lambda: f"read_{next(numbers)}")
    events = parser.feed(output) + parser.finish()
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    starts = {e.index: e for e in events if isinstance(e, ToolCallStart)}
    calls = []
    for end in (e for e in events if isinstance(e, ToolCallEnd)):
        start = starts[end.index]
        probe_id = PROBE_CALLS[end.index].id if end.index < len(PROBE_CALLS) else start.id
        form = ToolCall(start.id, start.name, end.arguments).form
        calls.append(ToolCall(with_form(probe_id, form), start.name, end.arguments))
    return Message("assistant", text, tool_calls=tuple(calls), reasoning=reasoning if thinking else None)


def _compare_calls(read: Message, turn: Message, thinking: bool) -> str:
    if len(read.tool_calls) != len(turn.tool_calls):
        return (f"the parser reads {len(read.tool_calls)} calls back from the rendered turn, not "
                f"{len(turn.tool_calls)}: calls in this template's format would reach the client as text")
    for i, (got, want) in enumerate(zip(read.tool_calls, turn.tool_calls)):
        # the same arguments in any order: a template that sorts keys (Gemma 4) reads them back sorted
        if got.name != want.name or _as_data(got.arguments) != _as_data(want.arguments):
            return f"call {i + 1} reads back as {got.name} {got.arguments}, not {want.name} {want.arguments}"
    if read.content.strip():
        return f"the parser reads text {read.content.strip()[:60]!r} around the calls"
    if thinking and (read.reasoning or "").strip() != _REASONING:
        return "the reasoning does not read back as written"
    return ""


def _as_data(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:
        return canonical_arguments(arguments)


def _context(a: str, b: str) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"{a[max(0, at - 20):at + 20]!r} became {b[max(0, at - 20):at + 20]!r}"
