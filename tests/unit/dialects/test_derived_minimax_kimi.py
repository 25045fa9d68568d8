"""MiniMax M3 and Kimi K3, derived from their templates in llama.cpp's set (the suites of test_derived_templates.py
run over both: round trip, split invariance, continuity, fenced samples); here what is their own:

- MiniMax M3 names the parameter's key in its closer (`NS<city>paris NS</city>`) and writes nested values as
  elements in the same markup (arrays as `NS<item>`), null left out; a turn without reasoning opens with
  `</mm:think>` alone.
- Kimi K3 names the value's type in the parameter's markup (`type="string"` / `type="number"`: "7" and 7 differ
  only there), counts calls from 1, and frames the text with markers its calls use too (`<|close|>response<|sep|>`).
"""

from __future__ import annotations

import json
import random

import pytest

from tests.support.dialect_harness import assert_split_invariant, counter
from tests.unit.dialects.test_derived_templates import (
    USER,
    _as_message,
    _looks_special,
    _matcher,
    _sample,
    templates,  # noqa: F401  (a fixture)
)
from zllm.canonical import FunctionTool, Message, ToolCall, ToolChoice
from zllm.dialects.base import Conversation, FenceSpec
from zllm.dialects.derived.dialect import derive_dialect
from zllm.dialects.derived.format import KEY_SLOT, TYPE_SLOT
from zllm.dialects.derived.probe import split_markers

FAMILIES = ("MiniMax-M3", "Kimi-K3")


@pytest.fixture(scope="module")
def derivations(templates):  # noqa: F811
    return {name: derive_dialect(templates[name], bos_token="<s>", eos_token="</s>") for name in FAMILIES}


@pytest.fixture(scope="module")
def stand_in(derivations, qwen_tokenizer):
    """As test_derived_templates' stand-in, for these two families' markers: Qwen's vocabulary plus each marker
    as one special token."""
    import copy

    import llguidance.hf

    tokenizer = copy.deepcopy(qwen_tokenizer)
    markers = {piece for d in derivations.values() for literal in d.dialect.format.literals()
               for piece in split_markers(literal) if piece.strip() and _looks_special(piece)}
    tokenizer.add_tokens(sorted(markers - set(tokenizer.get_added_vocab())), special_tokens=True)
    return tokenizer, llguidance.hf.from_tokenizer(tokenizer)

NS = "]<]minimax[>["
EDIT = FunctionTool("edit", "Edit files", {
    "type": "object",
    "properties": {
        "files": {"type": "array", "items": {"type": "object", "properties": {
            "path": {"type": "string", "maxLength": 8}, "lines": {"type": "array", "items": {"type": "integer"}}},
            "required": ["path"]}},
        "opts": {"type": "object", "required": ["force"],
                 "properties": {"force": {"type": "boolean"}, "tag": {"type": "string", "maxLength": 6}}},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "label": {"type": "string", "maxLength": 8},
    },
    "required": ["files", "count"], "additionalProperties": False})
EDIT_TOOLS = (EDIT,)
EDIT_ARGS = {"files": [{"path": "a <b>.py", "lines": [1, 20]}, {"path": "c.py", "lines": []}],
             "opts": {"force": True, "tag": "7"}, "count": 3, "label": "true"}


def _turn(args: dict, reasoning: str | None = None, text: str = "") -> Message:
    return Message("assistant", text, tool_calls=(ToolCall("call_1", "edit", json.dumps(args)),), reasoning=reasoning)


def _rendered_output(dialect, turn: Message, tools=EDIT_TOOLS, thinking=True) -> tuple[str, str]:
    prompt = dialect.render(Conversation((USER,), tools, thinking=thinking))
    full = dialect.render(Conversation((USER, turn), tools, add_generation_prompt=False, thinking=thinking))
    assert full.startswith(prompt)
    return prompt, full[len(prompt):]


def _read(dialect, text, tools=EDIT_TOOLS, thinking=True) -> Message:
    from tests.support.dialect_harness import parse_all

    return _as_message(parse_all(lambda: dialect.parser(tools, thinking=thinking, new_call_id=counter("c")), text))


def _fenced(dialect, spec, stand_in, text) -> bool:
    matcher = _matcher(dialect, spec, stand_in)
    # the vocabulary's own tokenization (llguidance's `parse_special` knows only `<...>`-shaped specials)
    tokens = stand_in[0].encode(text, add_special_tokens=False)
    return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) and \
        matcher.is_accepting()


# ------------------------------------------------------------------------------------------ MiniMax M3


def test_minimax_m3_is_described_in_the_derived_terms(derivations):
    fmt = derivations["MiniMax-M3"].dialect.format
    assert (fmt.param_open, fmt.param_mid, fmt.param_close) == (f"{NS}<", ">", f"{NS}</{KEY_SLOT}>")
    assert (fmt.xml_item, fmt.null_omitted, fmt.empty_think) == ("item", True, True)
    assert (fmt.think_open, fmt.think_close) == ("<mm:think>", "</mm:think>")
    assert f'{NS}<invoke name="' in fmt.call_open and fmt.call_close == f"{NS}</invoke>"


def test_minimax_m3_nested_values_read_back_by_the_schema(derivations, stand_in):
    """Arrays of objects, an empty array, booleans, a number, strings that read as a number or a boolean:
    parsed split-invariantly to the same arguments, and rendered back to the same text."""
    dialect = derivations["MiniMax-M3"].dialect
    prompt, output = _rendered_output(dialect, _turn(EDIT_ARGS, reasoning="plan"))
    output = output.removesuffix(dialect.format.turn_end)
    assert f"{NS}<files>{NS}<item>{NS}<path>a <b>.py{NS}</path>{NS}<lines>{NS}<item>1{NS}</item>" in output
    make = lambda: dialect.parser(EDIT_TOOLS, thinking=True, new_call_id=counter("c"))  # noqa: E731
    assert_split_invariant(make, output, tokenizer=stand_in[0], groupings=60)
    message = _read(dialect, output)
    (call,) = message.tool_calls
    assert json.loads(call.arguments) == EDIT_ARGS and message.reasoning == "plan"
    _, again = _rendered_output(dialect, message)
    assert again.removesuffix(dialect.format.turn_end) == output


def test_minimax_m3_nested_key_named_like_its_parameter_and_no_schema(derivations):
    """An element inside a value with the parameter's own name does not close it; without a schema, elements
    named `item` read as an array, others as an object, and scalars as what JSON spells alike."""
    dialect = derivations["MiniMax-M3"].dialect
    args = {"opts": {"opts": {"x": "y"}, "force": False}, "q": [["a", 2.5], {"item": 1}]}
    loose = FunctionTool("t", "", {"type": "object", "properties": {
        "opts": {"type": "object"}, "q": {"type": "array", "items": {}}}})
    turn = Message("assistant", "", tool_calls=(ToolCall("c1", "t", json.dumps(args)),))
    _, output = _rendered_output(dialect, turn, tools=(loose,))
    (call,) = _read(dialect, output, tools=(loose,)).tool_calls
    # {"item": 1} is written as [1] is: read as the array (the text, hence the next prompt, is the same)
    assert json.loads(call.arguments) == {"opts": {"opts": {"x": "y"}, "force": False}, "q": [["a", 2.5], [1]]}
    _, again = _rendered_output(dialect, Message("assistant", "", tool_calls=(call,)), tools=(loose,))
    assert again == output


def test_minimax_m3_turn_without_reasoning_opens_with_the_closer_alone(derivations, stand_in):
    dialect = derivations["MiniMax-M3"].dialect
    prompt, output = _rendered_output(dialect, Message("assistant", "Paris."))
    assert output.startswith("</mm:think>Paris.")
    message = _read(dialect, output.removesuffix(dialect.format.turn_end))
    assert (message.content, message.reasoning) == ("Paris.", None)
    following = dialect.render(Conversation((USER, message, Message("user", "more")), EDIT_TOOLS, thinking=True))
    assert following.startswith(prompt + output)
    spec_on, spec_off = FenceSpec(tools=EDIT_TOOLS, thinking=True), FenceSpec(tools=EDIT_TOOLS, thinking=False)
    assert _fenced(dialect, spec_on, stand_in, "</mm:think>Paris.")
    assert _fenced(dialect, spec_on, stand_in, "<mm:think>hm</mm:think>Paris.")
    assert not _fenced(dialect, spec_on, stand_in, "Paris.")
    # off, `thinking_mode` "disabled": the prompt writes the closer, the model answers at once
    assert _fenced(dialect, spec_off, stand_in, "Paris.")
    assert not _fenced(dialect, spec_off, stand_in, "</mm:think>Paris.")
    assert not _fenced(dialect, spec_off, stand_in, "<mm:think>hm</mm:think>Paris.")


def test_minimax_m3_thinking_mode_follows_the_clients_switch(derivations, stand_in):
    """MiniMax M3 reads `thinking_mode` (enabled / disabled / adaptive; not given: adaptive). Reasoning on is its
    default, "adaptive" (the model decides: the prompt opens nothing); off is "disabled": the system prompt says
    so and the generation prompt closes the block (`</mm:think>`). Prompt, parser and fence follow the client's
    switch, and a turn of text with a call round-trips and continues under each."""
    dialect = derivations["MiniMax-M3"].dialect
    assert (dialect.switch_variable, dialect.switch_words, dialect.thinking_default) == (
        "thinking_mode", {True: "adaptive", False: "disabled"}, True)
    on, off = (dialect.render(Conversation((USER,), EDIT_TOOLS, thinking=t)) for t in (True, False))
    assert "Current thinking mode: adaptive." in on and on.endswith("ai\n")
    assert "Current thinking mode: disabled." in off and off.endswith("ai\n</mm:think>")
    for thinking, written in ((True, "<mm:think>plan</mm:think>Editing."), (False, "Editing.")):
        turn = _turn({"files": [], "count": 1}, reasoning="plan" if thinking else None, text="Editing.")
        prompt, output = _rendered_output(dialect, turn, thinking=thinking)
        assert output.startswith(written), (thinking, output)
        written_out = output.removesuffix(dialect.format.turn_end)
        message = _read(dialect, written_out, thinking=thinking)
        assert (message.content, message.reasoning, len(message.tool_calls)) == (
            "Editing.", "plan" if thinking else None, 1)
        result = Message("tool", "ok", tool_call_id=message.tool_calls[0].id, name="edit")
        following = dialect.render(Conversation((USER, message, result), EDIT_TOOLS, thinking=thinking))
        assert following.startswith(prompt + output)
        assert _fenced(dialect, FenceSpec(tools=EDIT_TOOLS, thinking=thinking), stand_in, written_out)


def test_minimax_m3_fence_writes_nested_values_as_elements(derivations, stand_in):
    dialect = derivations["MiniMax-M3"].dialect
    spec = FenceSpec(tools=EDIT_TOOLS, choice=ToolChoice("tool", "edit"), thinking=False)
    head = f'{NS}<tool_call>\n{NS}<invoke name="edit">'  # reasoning off: the prompt closed the block
    tail = f"{NS}</invoke>\n{NS}</tool_call>"
    files = f"{NS}<files>{NS}<item>{NS}<path>a.py{NS}</path>{NS}<lines>{NS}<item>3{NS}</item>{NS}</lines>" \
            f"{NS}</item>{NS}</files>"
    count = f"{NS}<count>4{NS}</count>"
    for body, accepted in ((files + count, True), (f"{NS}<files>{NS}</files>{count}", True),
                           (files + f"{NS}<opts>{NS}<force>true{NS}</force>{NS}</opts>" + count, True),
                           (files, False),  # count is required
                           (f'{NS}<files>[{{"path": "a.py"}}]{NS}</files>{count}', False),  # JSON, not elements
                           (files.replace("<item>", "<it>").replace("</item>", "</it>") + count, False),
                           (files + f"{NS}<count>x{NS}</count>", False),
                           (files.replace("a.py", f"a{NS}<b>") + count, False)):
        assert _fenced(dialect, spec, stand_in, head + body + tail) is accepted, body


def test_minimax_m3_fenced_random_nested_calls_are_valid(derivations, stand_in):
    """Random logits under the fence for a tool with nested arrays and objects: each sample parses back to a
    call whose arguments fit the schema, and renders back as sampled."""
    dialect = derivations["MiniMax-M3"].dialect
    for seed in range(12):
        spec = FenceSpec(tools=EDIT_TOOLS, choice=ToolChoice("required"), thinking=False)
        text = _sample(_matcher(dialect, spec, stand_in), stand_in, random.Random(seed))
        message = _read(dialect, text, thinking=False)
        assert message.tool_calls, text
        for call in message.tool_calls:
            assert _fits(json.loads(call.arguments), EDIT.parameters), (text, call.arguments)
        prompt, again = _rendered_output(dialect, message, thinking=False)
        # llguidance's JSON numbers allow `-0`, which reads as 0 and the template writes `0`: the one spelling
        # of a sample that the next prompt writes otherwise (as in every dialect with JSON values)
        assert again.startswith(text.replace(">-0" + NS, ">0" + NS)), (text, again)


def _fits(value, schema: dict) -> bool:
    """The subset of JSON Schema EDIT uses."""
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return (isinstance(value, dict) and set(schema.get("required", ())) <= set(value)
                and all(k in props and _fits(v, props[k]) for k, v in value.items()))
    if kind == "array":
        return isinstance(value, list) and all(_fits(v, schema.get("items", {})) for v in value)
    if kind == "integer":
        return type(value) is int and schema.get("minimum", value) <= value <= schema.get("maximum", value)
    if kind == "boolean":
        return type(value) is bool
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", 10 ** 6)
    return True


# ------------------------------------------------------------------------------------------ Kimi K3


def test_kimi_k3_is_described_in_the_derived_terms(derivations):
    fmt = derivations["Kimi-K3"].dialect.format
    assert TYPE_SLOT in fmt.param_mid and dict(fmt.type_words) == {
        "string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null",
        "object": "object", "array": "array"}
    # the literals read as the template's tags, each ending with its `<|sep|>`
    assert (fmt.call_open, fmt.name_close, fmt.param_open, fmt.param_close, fmt.call_close) == (
        '<|open|>call tool="', '" index="\x01"<|sep|>', '<|open|>argument key="', "<|close|>argument<|sep|>",
        "<|close|>call<|sep|>")
    assert fmt.turn_end == "<|end_of_msg|>" and fmt.text_close == "<|close|>response<|sep|><|close|>message<|sep|>"
    assert fmt.gen_in_think and fmt.think_close.startswith("<|close|>think<|sep|>")


def test_kimi_k3_type_word_tells_a_string_from_a_number(derivations, stand_in):
    dialect = derivations["Kimi-K3"].dialect
    args = {"files": [{"path": "a.py", "lines": [1]}], "opts": {"force": True, "tag": "7"}, "count": 7,
            "label": "7"}
    prompt, output = _rendered_output(dialect, _turn(args, reasoning="plan", text="On it."))
    assert 'key="count" type="number"<|sep|>7<|close|>' in output and 'key="label" type="string"<|sep|>7<' in output
    output = output.removesuffix(dialect.format.turn_end)
    make = lambda: dialect.parser(EDIT_TOOLS, thinking=True, new_call_id=counter("c"))  # noqa: E731
    assert_split_invariant(make, output, tokenizer=stand_in[0], groupings=60)
    message = _read(dialect, output)
    assert (message.content, message.reasoning) == ("On it.", "plan")
    assert json.loads(message.tool_calls[0].arguments) == args
    # a string where the schema says integer, as the model wrote it: read by its type word, not the schema
    text = output.replace('key="count" type="number"<|sep|>7', 'key="count" type="string"<|sep|>7')
    assert json.loads(_read(dialect, text).tool_calls[0].arguments)["count"] == "7"


def test_kimi_k3_calls_count_from_one_and_are_fenced_by_type(derivations, stand_in):
    dialect = derivations["Kimi-K3"].dialect
    spec = FenceSpec(tools=EDIT_TOOLS, choice=ToolChoice("tool", "edit"), thinking=True)
    call = ('<|open|>call tool="edit" index="{i}"<|sep|><|open|>argument key="files" type="array"<|sep|>[]'
            '<|close|>argument<|sep|><|open|>argument key="count" type="{t}"<|sep|>{v}<|close|>argument<|sep|>'
            '<|close|>call<|sep|>')
    head = "r<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
    tail = "<|close|>tools<|sep|><|close|>message<|sep|>"
    for i, t, v, accepted in (("1", "number", "3", True), ("12", "number", "3", True), ("1", "string", "3", False),
                              ("1", "number", '"3"', False), ("x", "number", "3", False)):
        text = head + call.format(i=i, t=t, v=v) + tail
        assert _fenced(dialect, spec, stand_in, text) is accepted, (i, t, v)
    (got,) = _read(dialect, head + call.format(i="12", t="number", v="3") + tail).tool_calls
    assert json.loads(got.arguments) == {"files": [], "count": 3}


def test_kimi_k3_text_turn_closes_and_continues(derivations, stand_in):
    """A turn with text only: its closing framing (`<|close|>response<|sep|><|close|>message<|sep|>`) is not
    text, the fence lets the model write it, and the next prompt continues the turn whether it did or not."""
    dialect = derivations["Kimi-K3"].dialect
    fmt = dialect.format
    prompt, output = _rendered_output(dialect, Message("assistant", "Paris.", reasoning="easy"))
    assert output == "easy" + fmt.think_close + "Paris." + fmt.text_close + fmt.turn_end
    written = output.removesuffix(fmt.turn_end)
    for text in (written, written.removesuffix(fmt.text_close)):
        message = _read(dialect, text)
        assert (message.content, message.reasoning) == ("Paris.", "easy")
        following = dialect.render(Conversation((USER, message, Message("user", "more")), EDIT_TOOLS,
                                                thinking=True))
        assert following.startswith(prompt + text)
        assert _fenced(dialect, FenceSpec(tools=EDIT_TOOLS, thinking=True), stand_in, text)
    # the end-of-turn marker is one marker, never one the calls use (it stops generation)
    assert all(fmt.turn_end not in literal for literal in (fmt.call_open, fmt.call_close, fmt.param_close))


def test_minimax_m3_with_its_marker_as_one_token(templates, qwen_tokenizer):  # noqa: F811
    """M3's vocabulary has `]<]minimax[>[` as one special token (the stand-in above spells it as text): derived
    with it as an added token, the fence names it by id, accepts the rendered turn token by token, samples
    valid nested calls, and the read-back turn renders to the same tokens."""
    import copy

    import llguidance.hf

    specials = [NS, "<mm:think>", "</mm:think>", "[e~[", "]~b]"]
    tokenizer = copy.deepcopy(qwen_tokenizer)
    tokenizer.add_tokens(specials, special_tokens=True)
    vocab = (tokenizer, llguidance.hf.from_tokenizer(tokenizer))
    dialect = derive_dialect(templates["MiniMax-M3"], added_tokens=specials).dialect
    assert NS in dialect.markup
    assert dialect.format.turn_end == "[e~["  # the end-of-turn marker, now that it is known as one
    prompt, full = _rendered_output(dialect, _turn(EDIT_ARGS, reasoning="plan"))
    output = full[:full.rindex(dialect.format.turn_end)]
    assert _fenced(dialect, FenceSpec(tools=EDIT_TOOLS, thinking=True), vocab, output)
    message = _read(dialect, output)
    _, again = _rendered_output(dialect, message)
    assert tokenizer.encode(prompt + again, add_special_tokens=False) == \
        tokenizer.encode(prompt + full, add_special_tokens=False)
    spec = FenceSpec(tools=EDIT_TOOLS, choice=ToolChoice("required"), thinking=False)
    for seed in range(4):
        text = _sample(_matcher(dialect, spec, vocab), vocab, random.Random(seed))
        calls = _read(dialect, text, thinking=False).tool_calls
        assert calls and all(_fits(json.loads(c.arguments), EDIT.parameters) for c in calls), text


def test_kimi_k3_reads_its_thinking_switch_from_the_client(derivations, stand_in):
    """K3's template reads `thinking` (default on: the prompt opens `<|open|>think<|sep|>`); off, the prompt
    opens the response and turns carry no think block: prompt, parser and fence follow the client's switch, and
    a turn with text and two calls round-trips and continues."""
    dialect = derivations["Kimi-K3"].dialect
    assert (dialect.switch_variable, dialect.thinking_default, set(dialect.switched)) == ("thinking", True,
                                                                                          {True, False})
    off = dialect.render(Conversation((USER,), EDIT_TOOLS, thinking=False))
    assert off.endswith('<|open|>message role="assistant"<|sep|><|open|>response<|sep|>')
    assert dialect.render(Conversation((USER,), EDIT_TOOLS, thinking=True)).endswith("<|open|>think<|sep|>")
    calls = (ToolCall("call_1", "edit", json.dumps({"files": [], "count": 1})),
             ToolCall("call_2", "edit", json.dumps({"files": [{"path": "x"}], "count": 2})))
    turn = Message("assistant", "Two edits.", tool_calls=calls)
    prompt, output = _rendered_output(dialect, turn, thinking=False)
    assert "<|open|>think" not in output and 'index="2"' in output
    written = output[:output.rindex(dialect.format.turn_end)]
    message = _read(dialect, written, thinking=False)
    assert (message.content, message.reasoning, len(message.tool_calls)) == ("Two edits.", None, 2)
    results = tuple(Message("tool", f"ok {i}", tool_call_id=c.id, name=c.name)
                    for i, c in enumerate(message.tool_calls))
    following = dialect.render(Conversation((USER, message, *results), EDIT_TOOLS, thinking=False))
    assert following.startswith(prompt + output)
    assert _fenced(dialect, FenceSpec(tools=EDIT_TOOLS, thinking=False), stand_in, written)
    assert not _fenced(dialect, FenceSpec(tools=EDIT_TOOLS, thinking=False), stand_in,
                       "hm<|close|>think<|sep|><|open|>response<|sep|>" + written)
