"""Dialects derived from llama.cpp's 70 real chat templates (tests/support/llama_templates.py): for every template
that derives, a conversation with text, reasoning (where the family reasons), two calls and their results:

- round trip: the model-side output (the turn after the generation prompt) parses back to the same turn, which
  renders to the same text and the same tokens;
- the parser is split-invariant: whole, character by character, token by token, random groupings;
- the next turn's prompt starts with this turn's prompt + output + end-of-turn marker (prefix cache continues);
- the fence (llguidance) accepts that output token by token, and calls sampled under it at random are valid.

The tokenizer is a stand-in: the Qwen vocabulary with every marker the derived formats use added as a special
token (each family's markup is then one token, as in its own vocabulary).
"""

from __future__ import annotations

import json
import random

import pytest

from tests.support.dialect_harness import assert_split_invariant, counter, parse_all, token_pieces
from tests.support.fenced_tools import SEARCH, TOOLS, TOOLS_BY_NAME, WEATHER, valid
from zllm.canonical import (
    FunctionTool,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
    ToolChoice,
)
from zllm.dialects.base import Conversation, FenceSpec, MarkupTokens
from zllm.dialects.derived.dialect import derive_dialect
from zllm.dialects.derived.probe import split_markers, written_after

# what the derivation must find, by family (the priority ones of issue 21); the survey test reports the rest
MUST_DERIVE = (
    "Qwen3-Coder", "Qwen3.5-4B", "ByteDance-Seed-OSS", "StepFun3.5-Flash", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "mistralai-Ministral-3-14B-Reasoning-2512", "unsloth-mistral-Devstral-Small-2507",
    "meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct",
    "deepseek-ai-DeepSeek-V3.1", "MiniMax-M2", "MiniMax-M1", "ibm-granite-granite-4.0", "ibm-granite-granite-4.1",
    "GLM-4.6", "GLM-4.7-Flash", "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B",
    # ids the model writes: Mistral's nine-character ids (after the name / inside the JSON), Kimi K2's index
    "Mistral-Small-3.2-24B-Instruct-2506", "mistralai-Mistral-Nemo-Instruct-2407", "moonshotai-Kimi-K2",
    "Kimi-K2-Instruct", "Kimi-K2-Thinking",
    # arguments in the template's own notation, strings between quote markers (derived/notation.py)
    "google-gemma-4-31B-it",
    # string values wrapped in CDATA when they hold `<`, `&` or a newline, raw otherwise
    "openbmb-MiniCPM5-1B",
    # one call per turn: the template writes the first of two (GigaChat 3.1); Hermes JSON from templates that
    # need their tools to render (served derived, not by the hand-written Hermes); no end-of-turn marker of their
    # own, the results follow the calls (Apertus, Hunyuan 3)
    "GigaChat3.1-10B-A1.8B", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "Apertus-8B-Instruct", "tencent-Hy3",
    # the parameter's key in its closer, nested values as elements (derived/xml_values.py); the value's type in
    # the parameter's markup, the call's index from 1, the text framed by markers the calls use too
    "MiniMax-M3", "Kimi-K3",
    # keyword arguments in Python-call notation, strings raw between `'` (derived/kwargs.py)
    "LFM2.5-8B-A1B",
    # a turn of text opens with a lead a turn of calls does not (`<|content|>`; functionary v3.2's recipient
    # `all\n` against calls that open with their name, arguments given as JSON text); the call's id before its name
    "upstage-Solar-Open-100B", "meetkai-functionary-medium-v3.2",
    # ... a recipient (` to=user` / ` to=NAME`), the name written again inside the call, one message per call
    "muse-glimmer",
    # the text turn's end marker opens the call too (`<|message_sep|>` then a `function call` role)
    "GigaChat3-10B-A1.8B",
    # a block written after the last message (the `Action:` instruction), calls as JSON on lines of their own, no
    # end of turn after the calls; renders only with its tools, each parameter described
    "CohereForAI-c4ai-command-r-plus-tool_use",
)
# sampled 100 times under the fence; the others a few times each (CI time)
SAMPLED_MANY = ("Qwen3-Coder", "unsloth-mistral-Devstral-Small-2507", "meta-llama-Llama-3.1-8B-Instruct")


@pytest.fixture(scope="module")
def templates():
    from tests.support.llama_templates import TemplatesUnavailable, template_dir

    try:
        directory = template_dir()
    except TemplatesUnavailable as exc:
        pytest.skip(str(exc))
    return {path.stem: path.read_text() for path in sorted(directory.glob("*.jinja"))}


@pytest.fixture(scope="module")
def derivations(templates):
    return {name: derive_dialect(source, bos_token="<s>", eos_token="</s>") for name, source in templates.items()}


@pytest.fixture(scope="module")
def stand_in(derivations, qwen_tokenizer):
    """(tokenizer, llguidance tokenizer): Qwen's vocabulary plus every derived format's markers as special tokens."""
    import copy

    import llguidance.hf

    tokenizer = copy.deepcopy(qwen_tokenizer)
    markers = {piece for d in derivations.values() if d.derived for literal in d.dialect.format.literals()
               for piece in split_markers(literal) if piece.strip() and piece not in tokenizer.get_added_vocab()
               and _looks_special(piece)}
    tokenizer.add_tokens(sorted(markers), special_tokens=True)
    return tokenizer, llguidance.hf.from_tokenizer(tokenizer)


def _looks_special(piece: str) -> bool:
    # a whole marker (`<function=` is the start of a tag that other families write as text)
    return piece in split_markers(piece) and len(split_markers(piece)) == 1 and (
        piece[0] + piece[-1] in ("<>", "[]") and len(piece) > 2)


def _derived(derivations, name):
    result = derivations[name]
    if not result.derived:
        pytest.skip(f"{name}: {result.reason}")
    _NAMES[id(result.dialect)] = name
    return result.dialect


_NAMES: dict[int, str] = {}


def name_of(dialect) -> str:
    return _NAMES.get(id(dialect), "")


# ------------------------------------------------------------------------------------------ the conversation

USER = Message("user", "Weather in Paris for 3 days, then search rain.")
CALLS = (ToolCall("call_1", "get_weather", json.dumps({"city": "paris", "days": 3, "metric": True})),
         ToolCall("call_2", "search", json.dumps({"query": 'rain <b> "x"'})))


def _turn(dialect) -> Message:
    fmt = _fmt(dialect)
    calls = CALLS[:1] if fmt.single_call else CALLS
    # a template that writes the text after the calls moves it after their results in the next prompt (Gemma 4):
    # its models write text or calls (test_text_after_calls_reads_back checks that reading)
    text = "Let me check." if fmt.text_with_calls and not fmt.text_after_calls else ""
    return Message("assistant", text, tool_calls=calls, reasoning="I need the tools." if fmt.reasons else None)


NEXT_USER = Message("user", "zq-next-user")


def _on(dialect) -> bool:
    """The reasoning switch these tests run with: the template's default where it reads `enable_thinking`
    (its format depends on it), else on (an optional reasoning block allowed)."""
    return dialect.thinking_default if dialect.switched else True


def _fmt(dialect):
    return dialect.format_for(_on(dialect))


def _results(turn: Message) -> tuple[Message, ...]:
    return tuple(Message("tool", f"result {i}", tool_call_id=c.id, name=c.name) for i, c in enumerate(turn.tool_calls))


def _output(dialect):
    """(prompt, the model's output for the turn, the end-of-turn marker after it)."""
    prompt = dialect.render(Conversation((USER,), TOOLS, thinking=_on(dialect)))
    full = dialect.render(Conversation((USER, _turn(dialect)), TOOLS, add_generation_prompt=False,
                                       thinking=_on(dialect)))
    block = dialect.after_last_message
    if block:  # the turn between the prompt without the block the template writes after the last message, and it
        head = prompt.replace(block, "", 1)
        assert head != prompt and full.startswith(head) and full.endswith(block)
        output = full[len(head):len(full) - len(block)]
    elif name_of(dialect) not in PROMPT_REWRITTEN:
        assert full.startswith(prompt)
        output = full[len(prompt):]
    else:  # the template drops the reasoning block the prompt opened or closed: the turn as it is written once the
        # conversation goes on (Nemotron Nano v2 renders a last turn as a prefill, its text inside `<think>`)
        going_on = dialect.render(Conversation((USER, _turn(dialect), NEXT_USER), TOOLS, add_generation_prompt=False,
                                               thinking=_on(dialect)))
        output = written_after(dialect.template, prompt, going_on)
        output = output[:output.rfind(NEXT_USER.content)]
        reasoning = _turn(dialect).reasoning
        if reasoning and _fmt(dialect).gen_in_think and reasoning not in output:  # the model reasons first
            output = reasoning + output
    end = _fmt(dialect).call_turn_end or _fmt(dialect).turn_end  # the turn has calls
    if block and end not in output:  # no end of its own after the calls: the model's end-of-turn token stops it
        end = ""
    at = output.rfind(end) if end else len(output)
    return prompt, output[:at], end


def _parse(dialect, text, pieces=None, thinking=None):
    thinking = _on(dialect) if thinking is None else thinking
    return parse_all(lambda: dialect.parser(TOOLS, thinking=thinking, new_call_id=counter("call_")),
                     pieces if pieces is not None else text)


def _as_message(events) -> Message:
    text, reasoning, calls = "", "", []
    for event in events:
        if isinstance(event, TextDelta):
            text += event.text
        elif isinstance(event, ReasoningDelta):
            reasoning += event.text
        elif isinstance(event, ToolCallStart):
            calls.append([event.id, event.name, ""])
        elif isinstance(event, ToolCallEnd):
            calls[-1][2] = event.arguments
    # the parser's ids kept: a format that writes the model's own id carries it on them (derived/ids.py)
    return Message("assistant", text, tool_calls=tuple(ToolCall(i, n, a) for i, n, a in calls),
                   reasoning=reasoning or None)


# ------------------------------------------------------------------------------------------ the tests


def test_the_priority_families_derive(derivations):
    missing = {name: derivations[name].reason for name in TEMPLATE_NAMES if not derivations[name].derived}
    assert not missing


def test_survey(derivations, templates):
    """How many templates write calls and how many derive (printed with -s; the figures go in the report)."""
    writes = [n for n, d in derivations.items() if d.derived or "writes no tool calls" not in d.reason]
    derived = [n for n, d in derivations.items() if d.derived]
    print(f"\n{len(templates)} templates, {len(writes)} write calls, {len(derived)} derived")
    for name, d in derivations.items():
        print(f"{'OK ' if d.derived else 'NO '} {name}: {d.reason}")
    assert len(derived) >= len(MUST_DERIVE)


# the generation prompt opens (or closes) a reasoning block the turns the template renders drop: the calls are read
# from a turn rendered once the conversation goes on (probe.py `_drops_reasoning`): Nemotron Nano v2's `<TOOLCALL>`,
# Command R7B's and Cohere2MoE's `<|START_ACTION|>` with the call's index before its name, QwQ's Hermes JSON, the
# R1 distill's DeepSeek calls, Apriel 1.6's `<tool_calls>[...]` after a block its prompt opens with text
REASONING_DROPPED = ("NVIDIA-Nemotron-Nano-v2", "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "Cohere2MoE",
                     "Qwen-QwQ-32B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "Apriel-1.6-15b-Thinker-fixed",
                     # ... calls only in a turn without text (llama.cpp's own R1 template)
                     "llama-cpp-deepseek-r1")
# ... of which these rewrite the prompt at each turn (the block the prompt opened is gone from the next one): the
# cache forks there whatever the dialect, and the load check says so
PROMPT_REWRITTEN = {"NVIDIA-Nemotron-Nano-v2", "Qwen-QwQ-32B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                    "Apriel-1.6-15b-Thinker-fixed", "llama-cpp-deepseek-r1"}
# ... closed with plain text, no marker (Apriel 1.6's `\n[BEGIN FINAL RESPONSE]\n`)
REASONING_CLOSED_BY_TEXT = {"Apriel-1.6-15b-Thinker-fixed"}
# ... and turns of text only: Command R7B's turn of calls keeps the empty block its prompt closed, a turn of text
# drops it (the load check says so in its `text_turn`; its calls hold)
TEXT_TURN_REWRITTEN = PROMPT_REWRITTEN | {"CohereForAI-c4ai-command-r7b-12-2024-tool_use"}
TEMPLATE_NAMES = list(MUST_DERIVE) + list(REASONING_DROPPED)
# derived too, checked for the round trip and continuity only (the fence is the same code as above)
ALSO_DERIVED = ("Bielik-11B-v3.0-Instruct", "MiMo-VL", "inclusionai-ling-3.0-flash", "poolside-Laguna-S-2.1",
                "Spark2.5", "google-gemma-4-31B-it-interleaved", "meetkai-functionary-medium-v3.1",
                "unsloth-Apriel-1.5", "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2", "Reka-Edge")


@pytest.mark.parametrize("name", TEMPLATE_NAMES + list(ALSO_DERIVED))
def test_round_trip_same_text_and_tokens(name, derivations, stand_in):
    dialect = _derived(derivations, name)
    prompt, output, end = _output(dialect)
    message = _as_message(_parse(dialect, output))
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == \
        [(c.name, json.loads(c.arguments)) for c in _turn(dialect).tool_calls]
    again = dialect.render(Conversation((USER, message), TOOLS, add_generation_prompt=False, thinking=_on(dialect)))
    original = dialect.render(Conversation((USER, _turn(dialect)), TOOLS, add_generation_prompt=False,
                                           thinking=_on(dialect)))
    assert again == original
    tokenizer = stand_in[0]
    assert tokenizer.encode(again, add_special_tokens=False) == tokenizer.encode(original, add_special_tokens=False)


@pytest.mark.parametrize("name", TEMPLATE_NAMES + list(ALSO_DERIVED))
def test_parser_is_split_invariant(name, derivations, stand_in):
    dialect = _derived(derivations, name)
    _, output, _ = _output(dialect)
    make = lambda: dialect.parser(TOOLS, thinking=_on(dialect), new_call_id=counter("call_"))  # noqa: E731
    events = assert_split_invariant(make, output, tokenizer=stand_in[0], groupings=40)
    assert sum(isinstance(e, ToolCallEnd) for e in events) == len(_turn(dialect).tool_calls)


@pytest.mark.parametrize("name", TEMPLATE_NAMES + list(ALSO_DERIVED))
def test_next_turn_prompt_continues_this_turn(name, derivations):
    dialect = _derived(derivations, name)
    prompt, output, end = _output(dialect)
    parsed = _as_message(_parse(dialect, output))
    following = dialect.render(Conversation((USER, parsed, *_results(parsed)), TOOLS, thinking=_on(dialect)))
    if _fmt(dialect).bare_call_close and not following.startswith(prompt + output + end):
        pytest.xfail(f"{name}'s template adds an id to the calls once results follow: a turn written without "
                     "them forks the cache (test_history_ids_read_back_and_continue)")
    if _fmt(dialect).reasons and not following.startswith(prompt + output + end):
        pytest.xfail(f"{name}'s template drops the reasoning of a turn once results follow (the cache forks)")
    if name in PROMPT_REWRITTEN:
        assert not following.startswith(prompt + output + end)  # else it holds: no longer a known failure
        pytest.xfail(f"{name}'s template drops the reasoning block its prompt opened or closed: the cache forks")
    block = dialect.after_last_message
    if block:  # the block after the last message moves after the new ones: the turn continues the prompt without it
        assert not following.startswith(prompt) and following.startswith(prompt.replace(block, "", 1) + output + end)
        return
    assert following.startswith(prompt + output + end)


def _matcher(dialect, spec, stand_in):
    import llguidance

    tokenizer, ll_tokenizer = stand_in
    added = tokenizer.get_added_vocab()
    markup = MarkupTokens({p: added[p] for p in dialect.markup if p in added})
    grammar = dialect.fence_grammar(spec, markup)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar.lark, ll_tokenizer)
    assert not is_error, (messages, grammar.lark)
    return llguidance.LLMatcher(ll_tokenizer, grammar.lark)


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_fence_accepts_the_rendered_output(name, derivations, stand_in):
    dialect = _derived(derivations, name)
    _, output, _ = _output(dialect)
    for spec in (FenceSpec(tools=TOOLS, thinking=_on(dialect)),
                 FenceSpec(tools=TOOLS, thinking=_on(dialect), choice=ToolChoice("required"))):
        if spec.choice.mode == "required" and _as_message(_parse(dialect, output)).content:
            continue  # required: calls only
        matcher = _matcher(dialect, spec, stand_in)
        required_output = output if spec.choice.mode == "auto" else output
        tokens = stand_in[1].tokenize_str(required_output, parse_special=True)
        assert matcher.validate_tokens(tokens) == len(tokens), (required_output, matcher.get_error())
        assert matcher.consume_tokens(tokens) and matcher.is_accepting()


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_fenced_random_calls_are_valid(name, derivations, stand_in):
    """Random logits (what a tiny random-weight model gives) under the fence: every sample is a valid call
    of the allowed tool(s), and parses back to calls (required / named)."""
    dialect = _derived(derivations, name)
    if name in REASONING_CLOSED_BY_TEXT:
        pytest.skip(f"{name}'s prompt opens reasoning the model closes with plain text: random tokens rarely "
                    "spell it (test_fence_accepts_the_rendered_output checks the fence over the calls)")
    samples = 100 if name in SAMPLED_MANY else 3
    for choice in (ToolChoice("required"), ToolChoice("tool", "search")):
        spec = FenceSpec(tools=TOOLS, choice=choice, thinking=False)
        for seed in range(samples):
            text = _sample(_matcher(dialect, spec, stand_in), stand_in, random.Random(seed))
            message = _as_message(_parse(dialect, text, thinking=False))
            assert message.tool_calls, text
            for call in message.tool_calls:
                assert choice.mode != "tool" or call.name == "search"
                assert valid(TOOLS_BY_NAME[call.name], call.arguments), (text, call)


def _sample(matcher, stand_in, rng, limit=1200) -> str:
    """Tokens drawn at random among those the fence allows (structural ones favoured, so values end)."""
    import llguidance.numpy
    import numpy as np

    tokenizer, ll_tokenizer = stand_in
    bitmask = llguidance.numpy.allocate_token_bitmask(1, ll_tokenizer.vocab_size)
    short = _short_token_ids(tokenizer)
    added = set(tokenizer.get_added_vocab().values())
    out: list[int] = []
    for _ in range(limit):
        if matcher.is_stopped() or matcher.is_accepting() and rng.random() < 0.5:
            break
        llguidance.numpy.fill_next_token_bitmask(matcher, bitmask)
        assert not matcher.is_error(), matcher.get_error()
        bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:ll_tokenizer.vocab_size]
        allowed = np.flatnonzero(bits)
        draw = rng.random()
        preferred = ([t for t in allowed if t in added] if draw < 0.2 else
                     [t for t in allowed if t in short] if draw < 0.8 else [])
        candidates = preferred or list(allowed)
        token = int(rng.choice(candidates))
        # llguidance at times reports ParserTooComplex and leaves tokens in the mask that it then refuses:
        # draw again among the mask (what an engine that checks its token before consuming would do)
        for _ in range(50):
            if token == ll_tokenizer.eos_token or matcher.validate_tokens([token]) == 1:
                break
            token = int(rng.choice(candidates))
        if token == ll_tokenizer.eos_token:
            break
        assert matcher.consume_token(token), matcher.get_error()
        out.append(token)
    assert matcher.is_accepting(), tokenizer.decode(out)
    return tokenizer.decode(out, skip_special_tokens=False)


_SHORT: dict[int, set[int]] = {}


def _short_token_ids(tokenizer) -> set[int]:
    """Added tokens and one-character tokens: what ends a value or opens the next part quickly."""
    key = id(tokenizer)
    if key not in _SHORT:
        vocab = tokenizer.get_vocab()
        _SHORT[key] = {i for t, i in vocab.items() if len(t) <= 2} | set(tokenizer.get_added_vocab().values())
    return _SHORT[key]


# ------------------------------------------------------------------------------------------ the registry


def test_registry_tells_deepseek_v31_from_v32_by_the_template(templates):
    from zllm.dialects.registry import TokenizerFacts, choose_dialect

    vocab = frozenset({"<｜Assistant｜>", "<｜User｜>", "<think>", "</think>", "<｜tool▁calls▁begin｜>"})
    v31 = choose_dialect(TokenizerFacts(vocab, templates["deepseek-ai-DeepSeek-V3.1"]))
    v32 = choose_dialect(TokenizerFacts(vocab, templates["deepseek-ai-DeepSeek-V3.2"]))
    assert (v31.name, v32.name) == ("derived", "deepseek-v3.2")
    assert "<｜tool▁calls▁begin｜>" in v31.reason


def test_registry_keeps_hand_written_hermes_and_derives_the_others(templates):
    from zllm.dialects.registry import TokenizerFacts, choose_dialect

    qwen_vocab = frozenset({"<tool_call>", "</tool_call>", "<think>", "</think>"})
    assert choose_dialect(TokenizerFacts(qwen_vocab, templates["Qwen-Qwen2.5-7B-Instruct"])).name == "hermes"
    assert choose_dialect(TokenizerFacts(qwen_vocab, templates["Qwen-Qwen3-0.6B"])).name == "qwen3"
    coder = choose_dialect(TokenizerFacts(qwen_vocab, templates["Qwen3-Coder"]))
    assert coder.name == "derived" and "<parameter=" in coder.reason
    assert choose_dialect(TokenizerFacts(frozenset(), templates["unsloth-mistral-Devstral-Small-2507"])).name == "derived"


# ------------------------------------------------------------------------------------------ values, ids, indexes


def _events_of(dialect, text):
    return _as_message(_parse(dialect, text))


def test_python_spelled_values_are_typed_by_the_schema(derivations):
    """Qwen3-Coder writes a non-string value with `| string`: `True`, `None`; Seed-OSS an object as a Python
    literal too. Read back as JSON by the tool's schema, written back as the template spells them."""
    assert [derivations[n].dialect.format.constants for n in ("Qwen3-Coder", "Qwen3.5-4B", "ByteDance-Seed-OSS",
                                                              "GLM-4.6")] == ["python", "python", "python-objects", ""]
    coder = derivations["Qwen3-Coder"].dialect
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nTrue\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n<parameter=metric>\nFalse\n</parameter>\n</function>\n</tool_call>")
    (got,) = _events_of(coder, text).tool_calls
    assert json.loads(got.arguments) == {"city": "True", "days": 3, "metric": False}  # city is a string: raw
    again = coder.render(Conversation((USER, Message("assistant", "", tool_calls=(got,))), TOOLS,
                                      add_generation_prompt=False))
    assert text in again
    seed = derivations["ByteDance-Seed-OSS"].dialect
    nested = ("<seed:tool_call>\n<function=get_weather>\n<parameter=city>paris</parameter>\n<parameter=days>"
              "{'a': [True, None, 1]}</parameter>\n</function>\n</seed:tool_call>")
    (got,) = _events_of(seed, nested).tool_calls
    assert json.loads(got.arguments) == {"city": "paris", "days": {"a": [True, None, 1]}}


def test_the_fence_spells_booleans_as_the_template_does(derivations, stand_in):
    coder = derivations["Qwen3-Coder"].dialect
    spec = FenceSpec(tools=TOOLS, choice=ToolChoice("tool", "get_weather"))
    head = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nparis\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n<parameter=metric>\n")
    for value, accepted in (("True", True), ("False", True), ("true", False), ("1", False)):
        matcher = _matcher(coder, spec, stand_in)
        tokens = stand_in[1].tokenize_str(head + value + "\n</parameter>\n</function>\n</tool_call>",
                                          parse_special=True)
        assert (matcher.validate_tokens(tokens) == len(tokens)) is accepted, value


@pytest.mark.parametrize("name, written", [
    ("Mistral-Small-3.2-24B-Instruct-2506", '[TOOL_CALLS]search[CALL_ID]a1B2c3D4e[ARGS]{"query": "x"}'),
    ("mistralai-Mistral-Nemo-Instruct-2407",
     '[TOOL_CALLS][{"name": "search", "arguments": {"query": "x"}, "id": "a1B2c3D4e"}]'),
])
def test_an_id_the_model_writes_comes_back_in_the_next_prompt(name, written, derivations):
    from zllm.api.call_ids import ANTHROPIC, shown_call_id
    from zllm.dialects.derived.ids import written_id

    dialect = derivations[name].dialect
    assert dialect.format.id_pattern == "[A-Za-z0-9]{9}"
    (got,) = _events_of(dialect, written).tool_calls
    assert written_id(got.id) == "a1B2c3D4e"
    # an Anthropic client sends it back as toolu_...: the written id still rides on it
    for sent in (got.id, shown_call_id(got.id, ANTHROPIC)):
        call = ToolCall(sent, got.name, got.arguments)
        prompt = dialect.render(Conversation((USER, Message("assistant", "", tool_calls=(call,)),
                                              Message("tool", "r", tool_call_id=sent, name="search")), TOOLS))
        assert written in prompt and prompt.count("a1B2c3D4e") == 2
    # an id from elsewhere (another model, a client's own): one nine-character id for the call and its result
    foreign = ToolCall("toolu_01XYZ", "search", '{"query": "x"}')
    prompt = dialect.render(Conversation((USER, Message("assistant", "", tool_calls=(foreign,)),
                                          Message("tool", "r", tool_call_id="toolu_01XYZ")), TOOLS))
    assert "toolu_01XYZ" not in prompt


def test_the_fence_writes_ids_in_the_templates_shape(derivations, stand_in):
    dialect = derivations["Mistral-Small-3.2-24B-Instruct-2506"].dialect
    spec = FenceSpec(tools=TOOLS, choice=ToolChoice("tool", "search"))
    for call_id, accepted in (("a1B2c3D4e", True), ("abc", False), ("a1B2c3D4e5", False), ("a1B2c_D4e", False)):
        matcher = _matcher(dialect, spec, stand_in)
        tokens = stand_in[1].tokenize_str(f'[TOOL_CALLS]search[CALL_ID]{call_id}[ARGS]{{"query": "x"}}',
                                          parse_special=True)
        assert (matcher.validate_tokens(tokens) == len(tokens)) is accepted, call_id


def test_kimi_k2_call_index_is_read_and_fenced(derivations, stand_in):
    dialect = derivations["Kimi-K2-Thinking"].dialect
    text = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.search:7<|tool_call_argument_begin|>'
            '{"query": "x"}<|tool_call_end|><|tool_calls_section_end|>')
    (got,) = _events_of(dialect, text).tool_calls
    assert (got.name, json.loads(got.arguments)) == ("search", {"query": "x"})
    spec = FenceSpec(tools=TOOLS, choice=ToolChoice("tool", "search"))
    for index, accepted in (("7", True), ("12", True), ("x", False)):
        matcher = _matcher(dialect, spec, stand_in)
        tokens = stand_in[1].tokenize_str(text.replace(":7", f":{index}"), parse_special=True)
        assert (matcher.validate_tokens(tokens) == len(tokens)) is accepted, index


def test_the_load_check_holds_for_every_derived_template(derivations):
    """The round-trip check the daemon runs at load (dialects/round_trip.py: two calls, a boolean, results,
    reasoning) over each derived template, text compared: the figure in the README."""
    from zllm.dialects.round_trip import check_round_trip
    from zllm.prompt.stop_tokens import END_OF_TURN_TOKENS

    failed = {}
    for name, result in derivations.items():
        if result.derived:
            check = check_round_trip(result.dialect, None, encode=list, end_texts=(*END_OF_TURN_TOKENS, "</s>"))
            if not check.held:
                failed[name] = check.problem
    held = sum(d.derived for d in derivations.values()) - len(failed)
    print(f"\nload check: {held} of {sum(d.derived for d in derivations.values())} derived templates hold; {failed}")
    assert set(failed) <= KNOWN_LOAD_CHECK_FAILURES | PROMPT_REWRITTEN | AFTER_LAST_MESSAGE, failed
    for name in PROMPT_REWRITTEN:  # said as it is: the template rewrites the prompt
        assert "does not start with this turn's prompt" in failed[name], (name, failed.get(name))
    for name in AFTER_LAST_MESSAGE:  # ... or moves its block after the new messages, the calls reading back
        assert "after the last message" in failed[name] and "the calls read back and render the same" in \
            failed[name], (name, failed.get(name))


# said at load, still served: GigaChat 3 opens a call with its text turn's end marker (`<|message_sep|>`, then a
# `function call` role), so a turn cut at that marker holds no call
KNOWN_LOAD_CHECK_FAILURES = {"GigaChat3-10B-A1.8B"}
# the template writes a block after the last message (Command R+'s `Action:` instruction), which the next prompt
# moves after the new messages: no prompt starts with the one before; the calls still read back and render alike
AFTER_LAST_MESSAGE = {"CohereForAI-c4ai-command-r-plus-tool_use"}


def test_enable_thinking_follows_the_clients_switch(derivations, stand_in):
    """Qwen3.5 reads `enable_thinking` (default on: its prompt opens `<think>\\n`); off, the prompt closes an
    empty block and the model answers at once: the parser and the fence expect no reasoning, and the turn still
    round-trips and continues."""
    dialect = derivations["Qwen3.5-4B"].dialect
    assert dialect.supports_thinking and dialect.thinking_default and set(dialect.switched) == {True, False}
    on = dialect.render(Conversation((USER,), TOOLS, thinking=True))
    off = dialect.render(Conversation((USER,), TOOLS, thinking=False))
    assert on.endswith("<think>\n") and off.endswith("<think>\n\n</think>\n\n")
    output = ("Let me check.\n\n<tool_call>\n<function=search>\n<parameter=query>\nrain\n</parameter>\n</function>\n"
              "</tool_call>")
    message = _as_message(_parse(dialect, output, thinking=False))
    assert (message.content, message.reasoning, len(message.tool_calls)) == ("Let me check.", None, 1)
    assert _as_message(_parse(dialect, output, thinking=True)).reasoning  # on: the same text is reasoning
    full = dialect.render(Conversation((USER, message), TOOLS, add_generation_prompt=False, thinking=False))
    assert full.startswith(off + output)
    tokens = stand_in[1].tokenize_str(output, parse_special=True)
    matcher = _matcher(dialect, FenceSpec(tools=TOOLS, thinking=False), stand_in)
    assert matcher.validate_tokens(tokens) == len(tokens), matcher.get_error()
    reasoning_first = stand_in[1].tokenize_str("I think.\n</think>\n\n" + output, parse_special=True)
    matcher = _matcher(dialect, FenceSpec(tools=TOOLS, thinking=False), stand_in)
    assert matcher.validate_tokens(reasoning_first) < len(reasoning_first)


# ------------------------------------------------------------------------------------------ quoted values


def test_gemma4_notation_reads_back_every_json_type(derivations, stand_in):
    """Gemma 4 writes arguments in its own notation (strings between `<|"|>`, numbers and booleans bare, null as
    `None`, keys sorted): read back as JSON, written back by the template as the model wrote them."""
    dialect = derivations["google-gemma-4-31B-it"].dialect
    fmt = dialect.format
    assert (fmt.arguments, fmt.quote_open, fmt.null_word, fmt.sorted_keys) == ("notation", '<|"|>', "None", True)
    text = ('<|tool_call>call:search{a:[1,-2.5,<|"|>x, y:{z}<|"|>,[]],b:{c:None,d:true},query:<|"|>r "q"\n<|"|>,'
            'z:false}<tool_call|>')
    make = lambda: dialect.parser(TOOLS, thinking=True, new_call_id=counter("call_"))  # noqa: E731
    assert_split_invariant(make, text, tokenizer=stand_in[0], groupings=100)
    (got,) = _events_of(dialect, text).tool_calls
    assert json.loads(got.arguments) == {"a": [1, -2.5, "x, y:{z}", []], "b": {"c": None, "d": True},
                                         "query": 'r "q"\n', "z": False}
    again = dialect.render(Conversation((USER, Message("assistant", "", tool_calls=(got,))), TOOLS,
                                        add_generation_prompt=False))
    assert text in again
    # not the notation (a JSON string, a bare word): the call ends unfinished, the rest is text
    for broken in ('<|tool_call>call:search{query:"x"}<tool_call|>', "<|tool_call>call:search{query:x}<tool_call|>"):
        message = _events_of(dialect, broken)
        assert message.content and all(c.arguments != '{"query": "x"}' for c in message.tool_calls), broken


def test_gemma4_text_after_calls_reads_back(derivations):
    """The template writes a turn's text after its calls; a turn so written reads back and renders alike."""
    dialect = derivations["google-gemma-4-31B-it"].dialect
    assert dialect.format.text_after_calls and dialect.format.call_turn_end == "<|tool_response>"
    turn = Message("assistant", "Let me check.", tool_calls=CALLS)
    full = dialect.render(Conversation((USER, turn), TOOLS, add_generation_prompt=False, thinking=True))
    prompt = dialect.render(Conversation((USER,), TOOLS, thinking=True))
    assert full.startswith(prompt)
    output = full[len(prompt):].removesuffix("<|tool_response>")
    assert output.endswith("<tool_call|>Let me check.")
    message = _events_of(dialect, output)
    assert message.content == "Let me check." and len(message.tool_calls) == 2
    assert dialect.render(Conversation((USER, message), TOOLS, add_generation_prompt=False, thinking=True)) == full


def test_gemma4_fence_quotes_strings_with_the_templates_marker(derivations, stand_in):
    dialect = derivations["google-gemma-4-31B-it"].dialect
    spec = FenceSpec(tools=TOOLS, choice=ToolChoice("tool", "get_weather"), thinking=False)
    for args, accepted in (('{city:<|"|>rome<|"|>,days:3}', True), ('{city:<|"|>rome<|"|>,days:3,metric:false}', True),
                           ('{city:"rome",days:3}', False), ('{days:3,city:<|"|>rome<|"|>}', False),
                           ('{city:<|"|>rome<|"|>}', False), ('{city:<|"|>rome<|"|>,days:10}', False),
                           ('{city:<|"|>oslo<|"|>,days:3}', False), ('{city:<|"|>rome<|"|>,,days:3}', False)):
        matcher = _matcher(dialect, spec, stand_in)
        tokens = stand_in[1].tokenize_str(f"<|tool_call>call:get_weather{args}<tool_call|>", parse_special=True)
        assert (matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens)
                and matcher.is_accepting()) is accepted, args
    # keys in the template's order (sorted), whatever the schema's; an optional one left out without its comma
    unsorted = FunctionTool("t", "", {"type": "object", "properties": {
        "zeta": {"type": "integer"}, "mid": {"type": "boolean"}, "alpha": {"type": "string"}}, "required": ["zeta"]})
    spec = FenceSpec(tools=(unsorted,), choice=ToolChoice("required"), thinking=False)
    for args, accepted in (("{alpha:<|\"|>a<|\"|>,zeta:1}", True), ("{zeta:1}", True), ("{mid:None,zeta:1}", False),
                           ("{zeta:1,alpha:<|\"|>a<|\"|>}", False), ("{alpha:<|\"|>a<|\"|>,mid:true,zeta:1}", True),
                           ("{,zeta:1}", False), ("{alpha:<|\"|>a<|\"|>}", False)):
        matcher = _matcher(dialect, spec, stand_in)
        tokens = stand_in[1].tokenize_str(f"<|tool_call>call:t{args}<tool_call|>", parse_special=True)
        assert (matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens)
                and matcher.is_accepting()) is accepted, args


def test_minicpm5_cdata_values_read_back_raw_and_are_fenced_as_written(derivations, stand_in):
    """MiniCPM5 wraps a string value holding `<`, `&` or a newline in CDATA and writes others raw: read back
    unwrapped; the fence lets a value be written only the way the template would write it back."""
    dialect = derivations["openbmb-MiniCPM5-1B"].dialect
    assert (dialect.format.wrap_open, dialect.format.wrap_close, dialect.format.wrap_chars) == \
        ("<![CDATA[", "]]>", "<&\n")
    text = '<function name="search"><param name="query"><![CDATA[a <b> & c]]></param></function>'
    (got,) = _events_of(dialect, text).tool_calls
    assert json.loads(got.arguments) == {"query": "a <b> & c"}
    again = dialect.render(Conversation((USER, Message("assistant", "", tool_calls=(got,))), TOOLS,
                                        add_generation_prompt=False))
    assert text in again
    spec = FenceSpec(tools=TOOLS, choice=ToolChoice("tool", "search"), thinking=False)
    for value, accepted in (("rain", True), ("<![CDATA[a<b]]>", True), ("<![CDATA[a\nb]]>", True),
                            ("<![CDATA[rain]]>", False), ("a<b", False), ("a&b", False),
                            ("<![CDATA[a<bcdefghijklm]]>", False)):
        matcher = _matcher(dialect, spec, stand_in)
        tokens = stand_in[1].tokenize_str(f'<function name="search"><param name="query">{value}</param></function>',
                                          parse_special=True)
        assert (matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens)
                and matcher.is_accepting()) is accepted, value


def test_history_ids_read_back_and_continue(derivations, stand_in):
    """Apriel 1.5 writes each call's id in earlier turns (`, "id": "ID"}`), not in the turn the model writes:
    both read back; a turn written with ids (the fence allows it) is continued by the next prompt, and each
    call's own id comes back in it."""
    dialect = derivations["unsloth-Apriel-1.5"].dialect
    assert (dialect.format.call_close, dialect.format.bare_call_close) == (', "id": "\x00"}', "}")
    prompt = dialect.render(Conversation((USER,), TOOLS))
    output = ('\n<tool_calls>[{"name": "get_weather", "arguments": {"city": "paris", "days": 3}, "id": "c1"}, '
              '{"name": "search", "arguments": {"query": "rain"}, "id": "c2"}]</tool_calls>')
    message = _events_of(dialect, output)
    assert [json.loads(c.arguments) for c in message.tool_calls] == [{"city": "paris", "days": 3}, {"query": "rain"}]
    following = dialect.render(Conversation((USER, message, *_results(message)), TOOLS))
    assert following.startswith(prompt + output + "\n<|end|>")
    bare = output.replace(', "id": "c1"', "").replace(', "id": "c2"', "")
    assert len(_events_of(dialect, bare).tool_calls) == 2
    for text in (output, bare):
        matcher = _matcher(dialect, FenceSpec(tools=TOOLS, choice=ToolChoice("required")), stand_in)
        tokens = stand_in[1].tokenize_str(text, parse_special=True)
        assert matcher.validate_tokens(tokens) == len(tokens), (text, matcher.get_error())


# ------------------------------------------------------------------------------------------ keyword arguments

LFM_CALLS = ("<|tool_call_start|>[search(query='it's \"x\", y', a=1.5, b=True, c=None, "
             "o={\"k\": [true, null, \"v'w\"]}, "
             "l=['a', \"it's\", 2, False, None, {'k': 'v'}], d='print('a'); q')]<|tool_call_end|>")


def test_lfm_keyword_arguments_read_back_every_json_type(derivations, stand_in):
    """LFM2.5 writes keyword arguments in Python-call notation: strings raw between `'` (the template does not
    escape them: a string may hold the quote), True / False / None, objects as JSON, arrays as Python's repr. Read
    back as JSON, split-invariant, written back by the template as the model wrote them."""
    dialect = derivations["LFM2.5-8B-A1B"].dialect
    fmt = dialect.format
    assert (fmt.arguments, fmt.name_close, fmt.param_mid, fmt.pair_sep, fmt.quote_open, fmt.constants,
            fmt.object_literal, fmt.array_literal) == ("kwargs", "(", "=", ", ", "'", "python", "json", "python")
    make = lambda: dialect.parser(TOOLS, thinking=True, new_call_id=counter("call_"))  # noqa: E731
    text = "Let me check." + LFM_CALLS
    assert_split_invariant(make, text, tokenizer=stand_in[0], groupings=100)
    message = _events_of(dialect, text)
    (got,) = message.tool_calls
    assert message.content == "Let me check."
    assert json.loads(got.arguments) == {"query": "it's \"x\", y", "a": 1.5, "b": True, "c": None,
                                         "o": {"k": [True, None, "v'w"]},
                                         "l": ["a", "it's", 2, False, None, {"k": "v"}],
                                         "d": "print('a'); q"}
    again = dialect.render(Conversation((USER, Message("assistant", "", tool_calls=(got,))), TOOLS,
                                        add_generation_prompt=False))
    assert LFM_CALLS in again
    two = "<|tool_call_start|>[search(query='a'), get_weather(city='paris', days=3), search()]<|tool_call_end|>"
    assert [(c.name, json.loads(c.arguments)) for c in _events_of(dialect, two).tool_calls] == \
        [("search", {"query": "a"}), ("get_weather", {"city": "paris", "days": 3}), ("search", {})]
    # not the notation (a bare word, a key without `=`): the call ends unfinished, the rest is text
    for broken in ("<|tool_call_start|>[search(query=rain)]<|tool_call_end|>",
                   "<|tool_call_start|>[search(query 'x')]<|tool_call_end|>"):
        message = _events_of(dialect, broken)
        assert message.content.endswith(")]<|tool_call_end|>") and not any(
            c.arguments.endswith("}") for c in message.tool_calls), broken


def test_lfm_fence_ends_strings_only_where_the_parser_does(derivations, stand_in):
    """The fence lets a string hold the quote, except followed by what ends a string for the parser (`', KEY=`,
    `'), ` then a call, `')]` then the section's end); keys in schema order, True / False, strings quoted."""
    dialect = derivations["LFM2.5-8B-A1B"].dialect
    for choice, calls, accepted in (
            ("search", "search(query='it's')", True), ("search", "search(query='f('a')')", True),
            ("search", "search(query=''')", True), ("search", "search(query='a', b=')", False),
            ("search", "search(query='a'), b')", False), ("search", "search(query='x'), search(query='y')", True),
            ("search", "search(query=\"x\")", False), ("search", "search(query='0123456789abc')", False),
            ("get_weather", "get_weather(city='rome', days=3)", True),
            ("get_weather", "get_weather(city='rome', days=3, metric=False)", True),
            ("get_weather", "get_weather(city='rome', days=3, metric=false)", False),
            ("get_weather", "get_weather(days=3, city='rome')", False),
            ("get_weather", "get_weather(city='rome')", False),
            ("get_weather", "get_weather(city='oslo', days=3)", False),
            ("get_weather", "get_weather(city='rome',days=3)", False)):
        spec = FenceSpec(tools=TOOLS, choice=ToolChoice("tool", choice), thinking=False)
        matcher = _matcher(dialect, spec, stand_in)
        tokens = stand_in[1].tokenize_str(f"<|tool_call_start|>[{calls}]<|tool_call_end|>", parse_special=True)
        assert (matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens)
                and matcher.is_accepting()) is accepted, calls


# ------------------------------------------------------------------------------------------ the turn's end


def test_reka_turn_stopped_at_its_end_token_continues(derivations, stand_in):
    """Reka Edge ends a turn with `\\n\\n<sep>`: generation stops at the `<sep>` token, so the output ends with the
    `\\n\\n` the template writes before it: framing, not the turn's text (else the next prompt writes it twice)."""
    dialect = derivations["Reka-Edge"].dialect
    assert _fmt(dialect).turn_end == "\n\n<sep>" and "<sep>" in dialect.end_of_turn  # the token stopped at
    make = lambda: dialect.parser(TOOLS, thinking=False, new_call_id=counter("call_"))  # noqa: E731
    prompt = dialect.render(Conversation((USER,), TOOLS, thinking=False))
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'
    for output, text in ((" Hello\n\n", "Hello"), (" Hello\n\n\n", "Hello\n"), (" a\nb\n\n", "a\nb"),
                         (f" Let me check.\n{call}\n\n", "Let me check.")):
        events = assert_split_invariant(make, output, tokenizer=stand_in[0], groupings=20)
        message = _as_message(events)
        assert message.content == text, output
        results = _results(message)
        following = dialect.render(Conversation((USER, message, *results), TOOLS, thinking=False))
        assert following.startswith(prompt + output + "<sep>"), output
# ------------------------------------------------------------------------------------------ text leads


TEXT_LEADS = {"upstage-Solar-Open-100B": "<|content|>", "meetkai-functionary-medium-v3.2": "all\n",
              "muse-glimmer": " to=user<|message|>"}


@pytest.mark.parametrize("name", sorted(TEXT_LEADS))
def test_a_turn_of_text_opens_with_its_lead_and_one_of_calls_without(name, derivations, stand_in):
    """A template whose text turn opens with a lead its calls do not have (format.py `text_lead`): a turn of
    text reads back as its text alone (split-invariant), renders back the same, and the fence lets `auto` write
    it; a turn that opens otherwise is read as calls."""
    dialect = _derived(derivations, name)
    fmt = _fmt(dialect)
    assert fmt.text_lead == TEXT_LEADS[name]
    prompt = dialect.render(Conversation((USER,), TOOLS, thinking=False))
    turn = Message("assistant", "Sunny, 21 C.")
    full = dialect.render(Conversation((USER, turn), TOOLS, add_generation_prompt=False, thinking=False))
    output = full[len(prompt):full.rindex(fmt.turn_end)]
    assert output.startswith(fmt.text_lead)
    make = lambda: dialect.parser(TOOLS, thinking=False, new_call_id=counter("call_"))  # noqa: E731
    events = assert_split_invariant(make, output, tokenizer=stand_in[0], groupings=20)
    assert _as_message(events) == turn
    tokens = stand_in[1].tokenize_str(output, parse_special=True)
    matcher = _matcher(dialect, FenceSpec(tools=TOOLS, thinking=False), stand_in)
    assert matcher.validate_tokens(tokens) == len(tokens), (output, matcher.get_error())
    unled = stand_in[1].tokenize_str(output[len(fmt.text_lead):], parse_special=True)
    assert matcher.validate_tokens(unled) < len(unled)  # text without its lead would read as calls, or fork
    # the lead begun, then not finished: the text as written
    assert _as_message(_parse(dialect, fmt.text_lead[:-1], thinking=False)).content == fmt.text_lead[:-1]


def test_ids_before_the_name_and_names_written_twice_read_back(derivations):
    """Solar Open writes the call's id before its name (`<|tool_call:begin|>ID<|tool_call:name|>NAME`): the id
    comes back in the next prompt; muse-glimmer writes the name twice, and a second name that differs is no call."""
    from zllm.dialects.derived.ids import written_id

    solar = derivations["upstage-Solar-Open-100B"].dialect
    written = ('<|tool_calls|><|tool_call:begin|>zq7<|tool_call:name|>search<|tool_call:args|>{"query": "x"}'
               '<|tool_call:end|>')
    (got,) = _events_of(solar, written).tool_calls
    assert (written_id(got.id), got.name, json.loads(got.arguments)) == ("zq7", "search", {"query": "x"})
    prompt = solar.render(Conversation((USER, Message("assistant", "", tool_calls=(got,)),
                                        Message("tool", "r", tool_call_id=got.id, name="search")), TOOLS))
    assert written + "<|calls|>" in prompt
    muse = derivations["muse-glimmer"].dialect
    call = ' to=search<|message|><atem:function_calls>\n<atem:invoke name="{}">\n<atem:parameter name="query">x' \
           '</atem:parameter>\n</atem:invoke>\n</atem:function_calls>'
    assert [c.name for c in _events_of(muse, call.format("search")).tool_calls] == ["search"]
    assert not _events_of(muse, call.format("get_weather")).tool_calls


def test_an_index_written_before_the_name_is_read_for_any_number_of_calls(derivations, stand_in):
    """Command R7B numbers its calls before the name (`"tool_call_id": "0", "tool_name": "NAME"`), from 0: the
    number is a slot, not markup, so a third call reads and is fenced, and the fence allows no word in its place."""
    dialect = _derived(derivations, "CohereForAI-c4ai-command-r7b-12-2024-tool_use")
    one = '\n    {"tool_call_id": "%s", "tool_name": "search", "parameters": {"query": "q%s"}}'
    text = "<|START_ACTION|>[" + ",".join(one % (i, i) for i in range(3)) + "\n]"
    assert [(c.name, json.loads(c.arguments)) for c in _as_message(_parse(dialect, text, thinking=False)).tool_calls] \
        == [("search", {"query": f"q{i}"}) for i in range(3)]
    spec = FenceSpec(tools=TOOLS, choice=ToolChoice("required"), thinking=False)
    for index, accepted in (("2", True), ("x", False)):
        tokens = stand_in[1].tokenize_str(text.replace('"2"', f'"{index}"') + "<|END_ACTION|>", parse_special=True)
        assert (_matcher(dialect, spec, stand_in).validate_tokens(tokens) == len(tokens)) is accepted, index


@pytest.mark.parametrize("name, written", [
    # the model reasons inside the block the prompt opened, closes it, then calls
    ("NVIDIA-Nemotron-Nano-v2", 'I need rain.</think><TOOLCALL>[{"name": "search", "arguments": {"query": "q"}}]'
                                "</TOOLCALL>"),
    ("Cohere2MoE", 'I need rain.<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "search", '
                   '"parameters": {"query": "q"}}\n]<|END_ACTION|>'),
    # the block opened with text (`Here are my reasoning steps:\n`), a call without the id earlier turns carry
    ("Apriel-1.6-15b-Thinker-fixed", 'I need rain.\n[BEGIN FINAL RESPONSE]\n\n<tool_calls>[{"name": "search", '
                                     '"arguments": {"query": "q"}}]</tool_calls>'),
])
def test_calls_after_the_reasoning_the_prompt_opened_read_back(name, written, derivations):
    dialect = _derived(derivations, name)
    message = _as_message(_parse(dialect, written))
    assert message.reasoning == "I need rain."
    assert [(c.name, json.loads(c.arguments)) for c in message.tool_calls] == [("search", {"query": "q"})]
    assert not message.content.strip()


def test_an_end_marker_that_opens_a_call_ends_no_turn(derivations, stand_in):
    """GigaChat 3 ends a turn of text with `<|message_sep|>` and opens its call with it
    (`<|message_sep|>\\n\\nfunction call<|role_sep|>\\n{...}`): the marker never stops generation (the model's EOS
    ends the turn); after text it closes the text (dropped, with the template's `\\n\\n`), and the fence lets the
    turn end there or go on into a call."""
    dialect = _derived(derivations, "GigaChat3-10B-A1.8B")
    assert dialect.continues_turn == ("<|message_sep|>",) and "<|message_sep|>" not in dialect.end_of_turn
    # ... where a call may follow: without tools (or tool_choice none) it ends the turn (ClientBase.turn_stop_ids)
    assert dialect.ends_text_turn == ("<|message_sep|>",)
    none = _matcher(dialect, FenceSpec(tools=TOOLS, choice=ToolChoice("none"), thinking=False), stand_in)
    assert none.consume_tokens(stand_in[1].tokenize_str("Sunny, 21 C.<|message_sep|>", parse_special=True))
    make = lambda: dialect.parser(TOOLS, thinking=False, new_call_id=counter("call_"))  # noqa: E731
    for written in ("Sunny, 21 C.<|message_sep|>", "Sunny, 21 C.<|message_sep|>\n\n"):
        events = assert_split_invariant(make, written, tokenizer=stand_in[0], groupings=20)
        assert _as_message(events) == Message("assistant", "Sunny, 21 C."), written
    matcher = _matcher(dialect, FenceSpec(tools=TOOLS, thinking=False), stand_in)
    tokens = stand_in[1].tokenize_str("Sunny, 21 C.<|message_sep|>", parse_special=True)
    assert matcher.consume_tokens(tokens) and matcher.is_accepting()
    call = '\n\nfunction call<|role_sep|>\n{"name": "search", "arguments": {"query": "x"}}'
    rest = stand_in[1].tokenize_str(call, parse_special=True)
    assert matcher.validate_tokens(rest) == len(rest)
    # the load check holds, and its sample is the call alone (cut at the marker that closes it)
    from zllm.dialects.round_trip import check_round_trip

    check = check_round_trip(dialect, None, encode=list, end_texts=("</s>",))
    assert check.held and check.sample.startswith("<|message_sep|>") and check.sample.endswith('"Paris"}}')


# ------------------------------------------------------------------------------------------ calls or text


def test_a_template_that_writes_calls_only_without_text_gets_calls_or_text(derivations, stand_in):
    """llama.cpp's DeepSeek R1 template writes a turn's calls only where the turn has no text (with text, it drops
    the calls): the probe finds that rule; the fence lets a turn hold text or calls, never text then calls; a turn
    holding both (a client's history, or the model unfenced: the parser reads both) is rendered with its calls and
    without its text, so the results that follow still answer calls in the prompt."""
    dialect = _derived(derivations, "llama-cpp-deepseek-r1")
    fmt = _fmt(dialect)
    assert (fmt.text_with_calls, fmt.calls_drop_text) == (False, True)
    calls = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{"query": "x"}\n```'
             '<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    matcher = lambda: _matcher(dialect, FenceSpec(tools=TOOLS, thinking=True), stand_in)  # noqa: E731
    for output, accepted in (("Hm.</think>" + calls, True), ("Hm.</think>Let me check.", True),
                             ("Hm.</think>Let me check." + calls, False)):
        tokens = stand_in[1].tokenize_str(output, parse_special=True)
        assert (matcher().validate_tokens(tokens) == len(tokens)) is accepted, output
    both = _as_message(_parse(dialect, "Hm.</think>Let me check." + calls))  # unfenced: both read
    assert both.content == "Let me check." and [c.name for c in both.tool_calls] == ["search"]
    results = _results(both)
    rendered = dialect.render(Conversation((USER, both, *results), TOOLS))
    assert "Let me check." not in rendered and calls in rendered
    assert rendered == dialect.render(Conversation((USER, Message("assistant", "", tool_calls=both.tool_calls),
                                                    *results), TOOLS))


# ------------------------------------------------------------------------------------------ a block after the turn

COMMAND_R_PLUS = "CohereForAI-c4ai-command-r-plus-tool_use"


def test_a_block_after_the_last_message_is_found_and_the_calls_read_back(derivations, stand_in):
    """Command R+ writes its `Action:` instruction after the last message (before the generation prompt), its calls
    as JSON on lines of their own (`tojson(indent=4) | indent(8)`) and no end of turn after them: the probe reads the
    turns without the block; a turn cut where the model's end-of-turn token stops it (`]```` without the template's
    last newline) reads back as the calls alone; the fence takes the template's layout; the load check says the
    cache forks at each turn and that the calls read back; and the template, which needs its tools and each
    parameter's description, renders conversations without either."""
    from zllm.dialects.round_trip import check_round_trip

    dialect = _derived(derivations, COMMAND_R_PLUS)
    fmt = _fmt(dialect)
    assert (fmt.json_indent, fmt.json_margin, fmt.call_turn_end, fmt.section_close) == (4, 8, "", "\n]```\n")
    assert fmt.after_last.startswith("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Write 'Action:'")
    call = ('\nAction:\n```json\n[\n    {\n        "tool_name": "search",\n        "parameters": {\n'
            '            "query": "x"\n        }\n    }\n]```')
    make = lambda: dialect.parser(TOOLS, thinking=False, new_call_id=counter("call_"))  # noqa: E731
    for written in (call, call + "\n"):
        message = _as_message(assert_split_invariant(make, written, tokenizer=stand_in[0], groupings=20))
        assert (message.content, [(c.name, json.loads(c.arguments)) for c in message.tool_calls]) == \
            ("", [("search", {"query": "x"})]), written
    for choice in (ToolChoice("auto"), ToolChoice("required")):
        tokens = stand_in[1].tokenize_str(call + "\n", parse_special=True)
        matcher = _matcher(dialect, FenceSpec(tools=TOOLS, thinking=False, choice=choice), stand_in)
        assert matcher.consume_tokens(tokens) and matcher.is_stopped(), matcher.get_error()
    check = check_round_trip(dialect, None, encode=list, end_texts=("<|END_OF_TURN_TOKEN|>",))
    assert not check.held and "after the last message" in check.problem
    assert "the calls read back and render the same" in check.problem
    assert check.sample.startswith('\nAction:\n```json\n[\n    {\n        "tool_name": "get_weather"')
    bare = FunctionTool("t", "", {"type": "object", "properties": {"q": {"type": "string"}}})
    for tools in ((), (bare,)):
        prompt = dialect.render(Conversation((USER,), tools, thinking=False))
        assert prompt.endswith("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>") and USER.content in prompt


# ------------------------------------------------------------------------------------------ ends of turn


def test_an_eos_written_after_the_calls_ends_the_turn(templates):
    """Hy3 writes its EOS (`<｜hy_eos:opensource｜>`) right after the calls and none after the last turn's text:
    generation stops at that token, so the output never holds it; it ends the turn rather than closing the calls
    (else `</tool_calls:opensource>` is held for a closer that never comes, and reads back as text)."""
    from zllm.dialects.round_trip import check_round_trip

    eos = "<｜hy_eos:opensource｜>"
    dialect = derive_dialect(templates["tencent-Hy3"], bos_token="<s>", eos_token=eos).dialect
    assert not dialect.format.section_close.endswith(eos) and eos in dialect.end_of_turn
    check = check_round_trip(dialect, None, encode=list, end_texts=(eos,))
    assert check.held, check.problem


@pytest.mark.parametrize("name, setting, dropped", [
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "off", "<|START_THINKING|><|END_THIN"),
    ("Cohere2MoE", "off", "<|START_THINKING|>")])
def test_a_turn_of_text_the_template_rewrites_is_said(name, setting, dropped, templates):
    """Command R7B's generation prompt (reasoning off, its default) closes an empty plan,
    `<|START_THINKING|><|END_THINKING|>`, that its turns of calls write and its turns of text never do
    (`<|START_RESPONSE|>` follows `<|CHATBOT_TOKEN|>`); Cohere2MoE's opens `<|START_THINKING|>` and writes it in a turn
    of text only where the turn has reasoning. No parser can make the next prompt start with this one: the calls'
    round trip holds, and the check says the answers fork."""
    from zllm.dialects.round_trip import check_round_trip
    from zllm.prompt.dialect_check import round_trip_line

    dialect = derive_dialect(templates[name], bos_token="<s>", eos_token="<|END_OF_TURN_TOKEN|>").dialect
    check = check_round_trip(dialect, None, encode=list, end_texts=("<|END_OF_TURN_TOKEN|>",))
    assert check.held, check.problem
    assert f"with reasoning {setting}" in check.text_turn and f"{dropped}' became" in check.text_turn, check.text_turn
    assert round_trip_line(name, check).endswith("; " + check.text_turn)
