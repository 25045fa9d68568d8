"""Bare JSON calls in derived dialects (issue 21 item 4; dialects/bare_json.py): over llama.cpp's real templates,
a turn whose content opens with `{"name": DECLARED, "arguments": {...}}` is a call: parsed split-invariantly (whole,
character by character, token by token, random groupings), after the family's reasoning block too; the next
turn's prompt writes it back bare as the turn's text, so it continues this turn's prompt + output; the `auto`
fence admits it from the opening brace and keeps free text from opening that way; `required`, a named tool and
`none` never let it through. Ordinary JSON answers stay text. Llama 3.x, whose own calls are bare JSON, keeps
its own reading."""

from __future__ import annotations

import json

import pytest

from tests.support.dialect_harness import assert_split_invariant, counter, parse_all
from tests.support.fenced_tools import TOOLS
from tests.unit.dialects.test_derived_templates import (
    ALSO_DERIVED,
    TEMPLATE_NAMES,
    TEXT_TURN_REWRITTEN,
    USER,
    _as_message,
    _fmt,
    _matcher,
    _on,
    _results,
    templates,  # noqa: F401  (a fixture)
)
from zllm.canonical import Message, ReasoningDelta, TextDelta, ToolCall, ToolCallEnd, ToolCallStart, ToolChoice
from zllm.dialects.bare_json import reads_bare
from zllm.dialects.base import Conversation, FenceSpec
from zllm.dialects.derived.dialect import derive_dialect
from zllm.dialects.derived.probe import split_markers

BARE = '{"name": "search", "arguments": {"query": "rain <b> \\"x\\""}}'
BARE_ARGS = '{"query": "rain <b> \\"x\\""}'
LLAMA = ("meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct")
# not those whose prompt's reasoning block the rendered turn drops (the turn a bare call's prompt would continue is
# rewritten at each turn, test_derived_templates TEXT_TURN_REWRITTEN)
NAMES = [n for n in TEMPLATE_NAMES + list(ALSO_DERIVED) if n not in LLAMA and n not in TEXT_TURN_REWRITTEN]
# templates that refuse tool results after an assistant turn without calls ("no previous assistant message with a
# tool call"): a bare call comes back in the family's markup, and the cache forks at that turn
REFUSES_BARE_TURNS = ("MiniMax-M2", "google-gemma-4-31B-it")  # refuses or drops results after a turn without calls
# what the model may write that is JSON but no call: a name no tool has, a name not first, no name
NOT_CALLS = ('{"name": "Paris", "arguments": {}}', '{"city": "paris", "name": "search"}', '{"answer": 42}')


@pytest.fixture(scope="module")
def dialects(templates):  # noqa: F811
    out = {}
    for name in NAMES + list(LLAMA):
        result = derive_dialect(templates[name], bos_token="<s>", eos_token="</s>")
        assert result.derived, (name, result.reason)
        out[name] = result.dialect
    return out


@pytest.fixture(scope="module")
def stand_in(dialects, qwen_tokenizer):
    """As test_derived_templates' stand-in: Qwen's vocabulary plus these formats' markers as special tokens."""
    import copy

    import llguidance.hf

    tokenizer = copy.deepcopy(qwen_tokenizer)
    markers = {piece for d in dialects.values() for literal in d.format.literals() for piece in split_markers(literal)
               if piece.strip() and piece not in tokenizer.get_added_vocab()
               and len(split_markers(piece)) == 1 and piece[:1] in "<["}
    tokenizer.add_tokens(sorted(markers), special_tokens=True)
    return tokenizer, llguidance.hf.from_tokenizer(tokenizer)


def _bare_turn(dialect, call_id="call_0-bja") -> Message:
    reasoning = "I need the tools." if _fmt(dialect).reasons and _on(dialect) else None
    return Message("assistant", "", tool_calls=(ToolCall(call_id, "search", BARE_ARGS),), reasoning=reasoning)


def _bare_output(dialect) -> tuple[str, str, str]:
    """(prompt, the model's output when it writes the call bare, the end-of-turn marker), as the template
    renders a turn whose text is that bare object (what the model saw it write)."""
    prompt = dialect.render(Conversation((USER,), TOOLS, thinking=_on(dialect)))
    full = dialect.render(Conversation((USER, _bare_turn(dialect)), TOOLS, add_generation_prompt=False,
                                       thinking=_on(dialect)))
    block = dialect.after_last_message  # written after the last message (Command R+): the turn is read without it
    prompt, full = prompt.replace(block, "", 1), full.removesuffix(block) if block else full
    assert full.startswith(prompt), "the template renders a bare call's turn after its own generation prompt"
    output = full[len(prompt):]
    end = _fmt(dialect).turn_end
    output = output[:output.rfind(end)] if end else output
    close = _fmt(dialect).text_close
    if close and output.endswith(close):  # the text's closing framing (Kimi K3) ends the turn with its marker
        output, end = output[:len(output) - len(close)], close + end
    assert output.endswith(BARE), (output, "the template changed the bare object")
    return prompt, output, end


def _make(dialect, tools=TOOLS):
    return lambda: dialect.parser(tools, thinking=_on(dialect), new_call_id=counter("call_"))


@pytest.mark.parametrize("name", NAMES)
def test_a_bare_call_is_read_split_invariantly(name, dialects, stand_in):
    dialect = dialects[name]
    _, output, _ = _bare_output(dialect)
    events = assert_split_invariant(_make(dialect), output, tokenizer=stand_in[0], groupings=40)
    calls = [e for e in events if not isinstance(e, ReasoningDelta)]
    assert calls[0] == ToolCallStart(0, "call_0-bja", "search") and calls[-1] == ToolCallEnd(0, BARE_ARGS), events
    assert not any(isinstance(e, TextDelta) for e in events), events


@pytest.mark.parametrize("name", NAMES)
def test_the_next_turn_continues_a_bare_call(name, dialects):
    """The call renders back bare, as the turn's text: prompt + output + end-of-turn is where the next prompt
    starts (the cache continues), and the result still follows the call."""
    dialect = dialects[name]
    prompt, output, end = _bare_output(dialect)
    parsed = _as_message(parse_all(_make(dialect), output))
    assert parsed.tool_calls[0].form == "bja"
    following = dialect.render(Conversation((USER, parsed, *_results(parsed)), TOOLS, thinking=_on(dialect)))
    # (`prompt` is without the block a template writes after the last message, Command R+'s: the next prompt moves
    # that block after the new messages, and starts with the prompt without it)
    if name in REFUSES_BARE_TURNS:  # the call in the family's markup: the prompt forks at this turn
        assert not following.startswith(prompt + output) and following.startswith(prompt)
        assert "result 0" in following and BARE not in following
        return
    if _fmt(dialect).reasons and not following.startswith(prompt + output + end):
        pytest.xfail(f"{name}'s template drops the reasoning of a turn once results follow (the cache forks)")
    assert following.startswith(prompt + output + end)
    assert "result 0" in following[len(prompt + output + end):]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("text", NOT_CALLS)
def test_ordinary_json_stays_text(name, text, dialects, stand_in):
    dialect = dialects[name]
    _, output, _ = _bare_output(dialect)
    head = output[:output.rindex(BARE)]  # the reasoning block, where the template writes one
    events = assert_split_invariant(_make(dialect), head + text, tokenizer=stand_in[0], groupings=20)
    assert [e for e in events if not isinstance(e, ReasoningDelta)] == [TextDelta(text)]
    assert parse_all(_make(dialect, tools=()), head + BARE)[-1] == TextDelta(BARE)  # no tools: no bare calls


def test_what_follows_a_bare_call_is_the_familys_own(dialects):
    coder = dialects["Qwen3-Coder"]
    own = "<tool_call>\n<function=search>\n<parameter=query>\ny\n</parameter>\n</function>\n</tool_call>"
    events = parse_all(_make(coder), BARE + "\n" + own)
    assert [(type(e).__name__, getattr(e, "index", None)) for e in events if not isinstance(e, ToolCallEnd)] == [
        ("ToolCallStart", 0), ("ToolCallArgsDelta", 0), ("ToolCallStart", 1), ("ToolCallArgsDelta", 1)]
    # whitespace after the object is framing, however the output was cut
    assert assert_split_invariant(_make(coder), BARE + "\n\nDone.")[-1] == TextDelta("Done.")


@pytest.mark.parametrize("name", NAMES)
def test_the_auto_fence_admits_a_bare_call_from_its_opening_brace(name, dialects, stand_in):
    dialect = dialects[name]
    _, output, _ = _bare_output(dialect)
    head = output[:output.rindex(BARE)]

    def accepts(choice: ToolChoice, text: str) -> bool:
        matcher = _matcher(dialect, FenceSpec(tools=TOOLS, thinking=_on(dialect), choice=choice), stand_in)
        tokens = stand_in[1].tokenize_str(head + text, parse_special=True)
        return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) \
            and matcher.is_accepting()

    auto = ToolChoice("auto")
    assert accepts(auto, BARE)
    assert accepts(auto, BARE.replace('"arguments"', '"parameters"'))
    assert not accepts(auto, '{"name": "search", "arguments": {"query": 3}}')  # the schema holds
    assert not accepts(auto, BARE + "\nmore")  # the whole answer
    assert not accepts(auto, '{"name": "search", "args": 1}')  # text may not open as a bare call does
    if '{"' not in dialect.format.call_open:  # Apertus: a call opens `{"`, which free text never spells
        assert accepts(auto, '{"answer": 42}')
    for choice in (ToolChoice("required"), ToolChoice("tool", "search"), ToolChoice("none")):
        assert not accepts(choice, BARE), choice
    if '{"' not in dialect.format.call_open:
        assert accepts(ToolChoice("none"), '{"answer": 42}')


@pytest.mark.parametrize("name", LLAMA)
def test_llama_reads_its_own_bare_json_calls(name, dialects):
    """Llama 3.x's calls ARE bare JSON: its own format reads them (no form on the id), and renders them itself."""
    dialect = dialects[name]
    fmt = dialect.format
    assert not reads_bare(fmt.section_open + fmt.call_open)
    text = fmt.section_open + fmt.call_open + "search" + fmt.name_close + BARE_ARGS + fmt.call_close
    (call,) = _as_message(parse_all(_make(dialect), text)).tool_calls
    assert (call.name, json.loads(call.arguments), call.form) == ("search", json.loads(BARE_ARGS), "")


def test_the_whitespace_a_turn_opens_with_is_framing(dialects):
    """Laguna XS's template opens every turn with `\\n` (format.py `content_lead`): dropped before text and before
    a bare call, however the output was cut; with a longer lead, a part of it that is all the output is text."""
    import dataclasses

    from zllm.dialects.derived.parse import DerivedParser

    fmt = dialects["poolside-Laguna-XS-2.1"].format
    assert fmt.content_lead == "\n"
    for lead in ("\n", "\n \n"):
        make = lambda lead=lead: DerivedParser(dataclasses.replace(fmt, content_lead=lead), TOOLS,  # noqa: E731
                                               counter("call_"), thinking=False)
        assert assert_split_invariant(make, lead + "Hello.") == [TextDelta("Hello.")]
        events = assert_split_invariant(make, lead + BARE)
        assert events[0] == ToolCallStart(0, "call_0-bja", "search") and events[-1] == ToolCallEnd(0, BARE_ARGS)
    longer = lambda: DerivedParser(dataclasses.replace(fmt, content_lead="\n \n"), TOOLS,  # noqa: E731
                                   counter("call_"), thinking=False)
    assert assert_split_invariant(longer, "\n ") == [TextDelta("\n ")]
    assert assert_split_invariant(longer, "\n Hi") == [TextDelta("\n Hi")]
