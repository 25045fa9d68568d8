"""The harmony fence over the o200k_harmony stand-in: which token sequences it lets through, checked token by token
with the runtime's own FenceCompiler (stop ids as gpt-oss ships them: <|return|>, <|endoftext|>, <|call|>)."""

from __future__ import annotations

import pytest

from tests.support.harmony_models import CALL, ENDOFTEXT, RETURN, VOCAB_SIZE, harmony_tokenizer_or_skip
from zllm.canonical import FunctionTool, ToolChoice
from zllm.dialects.base import FenceSpec
from zllm.dialects.harmony.dialect import Harmony
from zllm.runtime.fence import FenceCompiler

# one name a prefix of the other: the template's header puts the name right before an added token
READ = FunctionTool("read", "r", {"type": "object", "properties": {"p": {"type": "string"}}, "required": ["p"]})
READ_FILE = FunctionTool("read_file", "r", {"type": "object", "properties": {"q": {"type": "integer"}},
                                            "required": ["q"]})
TOOLS = (READ, READ_FILE)
AUTO = FenceSpec(tools=TOOLS, choice=ToolChoice("auto"), thinking=True)
REQUIRED = FenceSpec(tools=TOOLS, choice=ToolChoice("required"), thinking=False)
NAMED = FenceSpec(tools=TOOLS, choice=ToolChoice("tool", "read_file"), thinking=False)
NONE = FenceSpec(tools=TOOLS, choice=ToolChoice("none"), thinking=True)
ANALYSIS = "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant"


@pytest.fixture(scope="module")
def fence():
    tokenizer = harmony_tokenizer_or_skip()
    compiler = FenceCompiler(tokenizer, vocab_size=VOCAB_SIZE, stop_token_ids=frozenset({RETURN, ENDOFTEXT, CALL}))
    markup = compiler.markup_tokens(Harmony())

    def allows(spec: FenceSpec, text: str, end: int | None = None) -> bool:
        matcher = compiler.compile(Harmony().fence_grammar(spec, markup))
        ids = tokenizer.encode(text, add_special_tokens=False) + ([end] if end is not None else [])
        try:
            for token in ids:
                matcher.advance(token)
        except Exception:
            return False
        return True

    return allows


@pytest.mark.parametrize("spec,text,end", [
    (AUTO, ANALYSIS + ' to=functions.read<|channel|>commentary json<|message|>{"p": "x"}<|call|>', None),
    (AUTO, ' to=functions.read_file<|channel|>commentary json<|message|>{"q": 3}<|call|>', None),
    (AUTO, '<|channel|>commentary to=functions.read <|constrain|>json<|message|>{"p": "x"}<|call|>', None),
    (AUTO, '<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.read<|channel|>'
           'commentary json<|message|>{"p": "x"}<|call|>', None),
    (AUTO, ANALYSIS + "<|channel|>final<|message|>Hello there", RETURN),
    (REQUIRED, ' to=functions.read<|channel|>commentary json<|message|>{"p": "x"}<|call|>', None),
    (NAMED, ' to=functions.read_file<|channel|>commentary json<|message|>{"q": 1}<|call|>', None),
    (NONE, "<|channel|>final<|message|>Just text.", RETURN),
], ids=["analysis-then-call", "prefix-named-tool", "harmony-spelling", "preamble", "answer", "required", "named",
        "none"])
def test_allows(fence, spec, text, end) -> None:
    assert fence(spec, text, end)


@pytest.mark.parametrize("spec,text,end", [
    (AUTO, ' to=functions.read<|channel|>commentary json<|message|>{"p": 3}<|call|>', None),  # schema
    (AUTO, ' to=functions.read<|channel|>commentary json<|message|>{"p":"x"}<|call|>', None),  # canonical spacing
    (AUTO, ' to=functions.nope<|channel|>', None),  # undeclared tool
    (AUTO, "<|channel|>final<|message|>spelled <|call|> as text", None),
    (REQUIRED, "<|channel|>final<|message|>x", None),
    (REQUIRED, "<|channel|>commentary<|message|>x", None),  # no preamble where only a call may come
    (REQUIRED, ANALYSIS, None),  # no analysis when reasoning is off
    (NAMED, ' to=functions.read<|channel|>', None),
    (NONE, ' to=functions.read', None),
], ids=["schema", "spacing", "unknown-tool", "markup-as-text", "required-answer", "required-preamble",
        "no-analysis", "named-other", "none-call"])
def test_refuses(fence, spec, text, end) -> None:
    assert not fence(spec, text, end)
