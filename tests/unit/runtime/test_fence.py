"""The token fence over the real Qwen vocabulary: grammar-valid output from a random model, EOS only where the
grammar may end, clone / draft masks agreeing with a straight walk, refusals of fences that
cannot be satisfied, and padded vocabulary rows never allowed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.support.tiny_models import QWEN_VOCAB_SIZE, tiny_qwen_tokenizer
from zllm.dialects.base import CANONICAL_JSON_GUIDANCE, FenceGrammar
from zllm.engine.sampler import Sampler, SamplingConfig
from zllm.engine.torch.runner import ModelRunner
from zllm.errors import ConfigError, InvalidRequest
from zllm.runtime.fence import FenceCompiler, FenceViolation, sample_fenced
from zllm.runtime.fence_mask import mask_logits
from zllm.runtime.fence_vocab import UNSATISFIABLE, lark_quoted_strings
from zllm.runtime.loop_guard import LoopGuard, LoopGuardConfig

IM_END, END_OF_TEXT, TOOL_CALL, TOOL_CALL_END = 151645, 151643, 151657, 151658
STOP_IDS = frozenset({IM_END, END_OF_TEXT})
REAL_TOKENS = 151669  # the Qwen tokenizer's size; logits rows above it are padding

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "count": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 2},
    },
    "required": ["name", "count", "ok", "tags"],
    "additionalProperties": False,
    "x-guidance": CANONICAL_JSON_GUIDANCE,  # no free whitespace: a random model would pad forever
}
JSON_GRAMMAR = FenceGrammar("%llguidance {}\nstart: %json " + json.dumps(SCHEMA))
# Hermes-style call on Qwen: <tool_call> / </tool_call> are single added tokens, named by id
CALL_GRAMMAR = FenceGrammar(
    "%llguidance {}\n"
    f'start: <[{TOOL_CALL}]> "\\n" call "\\n" <[{TOOL_CALL_END}]>\n'
    'call: %json {"type": "object", "properties": {"name": {"const": "get_weather"}, '
    '"arguments": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}, '
    '"required": ["name", "arguments"], "x-guidance": {"whitespace_flexible": false}}',
    literals=("<tool_call>", "</tool_call>"),
)
CALL_TEXT = '\n{"name":"get_weather","arguments":{"city":"Paris"}}\n'


@pytest.fixture(scope="module")
def compiler() -> FenceCompiler:
    return FenceCompiler(tiny_qwen_tokenizer(), vocab_size=QWEN_VOCAB_SIZE, stop_token_ids=STOP_IDS)


def call_tokens() -> list[int]:
    return [TOOL_CALL, *tiny_qwen_tokenizer().encode(CALL_TEXT, add_special_tokens=False), TOOL_CALL_END]


def check_schema(value, schema: dict) -> None:
    """The subset of JSON Schema that SCHEMA uses, strictly."""
    if "enum" in schema:
        assert value in schema["enum"]
        return
    kind = schema["type"]
    if kind == "object":
        assert isinstance(value, dict) and set(value) == set(schema["required"]) == set(schema["properties"])
        for key, sub in schema["properties"].items():
            check_schema(value[key], sub)
    elif kind == "array":
        assert isinstance(value, list) and len(value) <= schema["maxItems"]
        for item in value:
            check_schema(item, schema["items"])
    elif kind == "string":
        assert isinstance(value, str) and len(value) <= schema["maxLength"]
    elif kind == "integer":
        assert type(value) is int and schema["minimum"] <= value <= schema["maximum"]
    elif kind == "boolean":
        assert type(value) is bool


# ---------------------------------------------------------------------------------------------- sampling


def test_runner_and_sampler_under_a_fence_write_schema_valid_json(tiny_qwen, compiler) -> None:
    """The engine loop's shape: prefill, then apply → sample (or sample_fenced) → advance → decode until a
    stop token."""
    runner, tokenizer = ModelRunner(tiny_qwen.model), tiny_qwen.tokenizer
    prompt = tokenizer.encode("Reply in JSON:", add_special_tokens=False)
    for seed in range(2):
        fence, sampler, cache = compiler.compile(JSON_GRAMMAR), Sampler(SamplingConfig(seed=seed)), runner.new_cache()
        with torch.inference_mode():
            logits, output = runner.prefill(prompt, cache), []
            for _ in range(100):
                if seed % 2:  # the sample-first path the engine loop can take
                    token = sample_fenced(sampler, logits, fence)
                else:
                    fence.apply(logits)
                    token = sampler(logits)
                fence.advance(token.item())
                if token.item() in STOP_IDS:
                    break
                output.append(token.item())
                logits = runner.decode(token, cache)
        assert fence.is_stopped(), f"seed {seed}: the grammar never completed"
        check_schema(json.loads(tokenizer.decode(output)), SCHEMA)


def test_100_of_100_sampled_rows_are_schema_valid(tiny_qwen, compiler) -> None:
    """100 independently sampled generations, batched as rows of one forward (finished rows leave the batch),
    each row masked by its own fence as the engine loop masks it."""
    model, tokenizer = tiny_qwen.model, tiny_qwen.tokenizer
    prompt = tokenizer.encode("Reply in JSON:", add_special_tokens=False)
    fences = [compiler.compile(JSON_GRAMMAR) for _ in range(100)]
    outputs: list[list[int]] = [[] for _ in fences]
    live = list(range(len(fences)))  # batch row i generates output live[i]
    generator = torch.Generator().manual_seed(0)
    ids, cache = torch.tensor([prompt] * len(live)), ModelRunner(model).new_cache()
    with torch.inference_mode():
        for _ in range(60):
            logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            for batch_row, row in enumerate(live):
                fences[row].apply(logits[batch_row])  # a view of the row: masked in place
            ids = sample_rows(logits, generator)  # [len(live), 1]
            for batch_row, row in enumerate(live):
                fences[row].advance(ids[batch_row].item())
                outputs[row].append(ids[batch_row].item())
            keep = [i for i, row in enumerate(live) if outputs[row][-1] not in STOP_IDS]
            if not keep:
                break
            if len(keep) < len(live):
                cache.batch_select_indices(torch.tensor(keep))
                ids, live = ids[keep], [live[i] for i in keep]
    for row, output in enumerate(outputs):
        assert fences[row].is_stopped() and output[-1] in STOP_IDS, f"row {row} did not finish: {output}"
        check_schema(json.loads(tokenizer.decode(output[:-1])), SCHEMA)


def sample_rows(logits: torch.Tensor, generator: torch.Generator, top_k: int = 40) -> torch.Tensor:
    """One top-k draw per row (softmax or multinomial over all 150K columns of 100 rows would be most of this
    test's time). Masked tokens are -inf, so they stay out of the top k unless fewer than k are allowed, and
    then their probability is 0. logits: [rows, vocab] → [rows, 1] token ids."""
    top, ids = logits.topk(top_k, dim=-1)  # [rows, k]
    choice = torch.multinomial(torch.softmax(top, dim=-1), 1, generator=generator)  # [rows, 1]
    return ids.gather(-1, choice)


def test_sample_fenced_masks_only_when_the_draw_strays(compiler) -> None:
    newline = tiny_qwen_tokenizer().encode("\n", add_special_tokens=False)[0]
    fence = compiler.compile(CALL_GRAMMAR)
    fence.advance(TOOL_CALL)  # now only "\n" is allowed
    greedy = Sampler(SamplingConfig(temperature=0.0))
    logits = torch.zeros(QWEN_VOCAB_SIZE)
    logits[newline] = 5.0
    assert sample_fenced(greedy, logits, fence).item() == newline
    assert torch.isfinite(logits).all()  # the draw was allowed: the mask was never applied
    logits[IM_END] = 9.0  # the model strays
    assert sample_fenced(greedy, logits, fence).item() == newline
    assert torch.isfinite(logits).sum() == 1
    nucleus = Sampler(SamplingConfig(temperature=1.0, top_p=0.9, seed=1))  # candidates depend on the mask
    logits = torch.zeros(QWEN_VOCAB_SIZE)
    assert sample_fenced(nucleus, logits, fence).item() == newline and torch.isfinite(logits).sum() == 1
    assert sample_fenced(greedy, torch.ones(3), None).shape == (1, 1)  # no fence: the sampler alone


# ---------------------------------------------------------------------------------------------- state


def test_stop_tokens_are_masked_while_the_structure_is_open(compiler) -> None:
    fence, tokens = compiler.compile(CALL_GRAMMAR), call_tokens()
    for token in tokens:
        assert not fence.allowed(IM_END) and not fence.allowed(END_OF_TEXT) and not fence.is_accepting()
        logits = torch.zeros(QWEN_VOCAB_SIZE)
        fence.apply(logits)
        assert logits[IM_END] == float("-inf") and logits[token] == 0.0
        fence.advance(token)
    assert fence.is_accepting() and fence.is_stopped()
    assert fence.allowed(IM_END) and fence.allowed(END_OF_TEXT) and fence.allowed_count() == 2


def test_single_token_markup_is_the_only_way_in(compiler) -> None:
    fence = compiler.compile(CALL_GRAMMAR)
    assert fence.allowed_count() == 1 and fence.allowed(TOOL_CALL)
    assert not fence.allowed(tiny_qwen_tokenizer().encode("<", add_special_tokens=False)[0])
    assert fence.forced_tokens()[0] == TOOL_CALL
    assert not fence.allows_other_than(TOOL_CALL) and fence.allows_other_than(IM_END)


def test_the_loop_guard_never_bans_what_the_fence_forces(compiler) -> None:
    guard = LoopGuard(LoopGuardConfig(min_span=4, min_repeats=2))
    for _ in range(4):
        guard.observe(TOOL_CALL)  # a loop of <tool_call> tokens: the guard would ban another one
    fence, logits = compiler.compile(CALL_GRAMMAR), torch.zeros(QWEN_VOCAB_SIZE)
    fence.apply(logits)
    assert guard.next_banned() == TOOL_CALL and guard.ban(logits, fence) is None  # the only token allowed
    assert logits[TOOL_CALL] == 0.0
    free = compiler.compile(FenceGrammar(f"%llguidance {{}}\nstart: <[{TOOL_CALL}]> | <[{TOOL_CALL_END}]>"))
    assert guard.ban(logits, free) == TOOL_CALL and logits[TOOL_CALL] == float("-inf")


def test_a_token_outside_the_fence_is_refused(compiler) -> None:
    fence = compiler.compile(CALL_GRAMMAR)
    with pytest.raises(FenceViolation):
        fence.advance(IM_END)


def test_a_clone_walks_on_with_identical_masks(compiler) -> None:
    tokens = call_tokens()
    reference, fence = compiler.compile(CALL_GRAMMAR), compiler.compile(CALL_GRAMMAR)
    masks = []  # masks[i]: before tokens[i]
    for token in tokens:
        masks.append(reference.mask().copy())
        reference.advance(token)
    for token in tokens[:len(tokens) - 5]:
        fence.advance(token)
    assert np.array_equal(fence.mask(), masks[len(tokens) - 5])
    twin = fence.clone()
    for i, token in enumerate(tokens[len(tokens) - 5:], start=len(tokens) - 5):
        assert np.array_equal(twin.mask(), masks[i])
        twin.advance(token)
    assert twin.is_stopped() and not fence.is_stopped()  # the clone's state is its own


def test_draft_masks_on_a_probe_then_commit_the_accepted_prefix(compiler) -> None:
    tokens = call_tokens()
    fence = compiler.compile(CALL_GRAMMAR)
    reference = compiler.compile(CALL_GRAMMAR)
    masks = []
    for token in tokens:
        masks.append(reference.mask().copy())
        reference.advance(token)
    for token in tokens[:3]:
        fence.advance(token)
    before = fence.mask().copy()
    draft = [*tokens[3:6], IM_END, tokens[7]]  # the 4th draft token breaks the grammar
    assert fence.valid_prefix(draft) == 3  # no mask computed: the draft is cut before anything masks it
    drafted = fence.draft_masks(draft)
    assert drafted.shape == (3, compiler.vocab.mask_words)  # before each of the 3 valid tokens
    for i in range(3):
        assert np.array_equal(drafted[i], masks[3 + i])
    assert np.array_equal(fence.draft_masks(draft[:2]), drafted[:2])  # a gated draft: its own masks only
    assert np.array_equal(fence.mask(), before)  # the probe moved, the fence did not
    for token in draft[:2]:  # the verifier accepted two: the engine loop feeds them one by one
        fence.advance(token)
    assert np.array_equal(fence.mask(), masks[5])


def test_compiled_grammars_are_cached_and_fences_independent(compiler) -> None:
    first, second = compiler.compile(CALL_GRAMMAR), compiler.compile(CALL_GRAMMAR)
    assert compiler.cached_grammars >= 1
    first.advance(TOOL_CALL)
    assert second.allowed(TOOL_CALL) and not first.allowed(TOOL_CALL)


# ---------------------------------------------------------------------------------------------- vocabulary


def test_padded_vocab_rows_are_always_masked(compiler) -> None:
    fence = compiler.compile(FenceGrammar("%llguidance {}\nstart: <[*]> <[*]>"))  # any id, padding included
    assert fence.allowed(REAL_TOKENS - 1) and not fence.allowed(REAL_TOKENS) and not fence.allowed(151700)
    logits = torch.zeros(QWEN_VOCAB_SIZE)
    fence.apply(logits)
    assert torch.isinf(logits[REAL_TOKENS:]).all() and torch.isfinite(logits[:REAL_TOKENS]).all()


# numpy (llama.cpp's logits), the numpy view of a CPU float32 tensor, torch ops (another dtype or a GPU)
@pytest.mark.parametrize("kind", ["numpy", "float32", "bfloat16"])
@pytest.mark.parametrize("sparse", [False, True])
def test_mask_logits_sets_exactly_the_disallowed_ids(kind, sparse) -> None:
    rng = np.random.default_rng(7)
    words = rng.integers(-2**31, 2**31 - 1, (3, 40), dtype=np.int32)
    if sparse:  # two nonzero words a row: the keep-and-fill path
        words[:, 2:] = 0
    values = rng.standard_normal((3, 1290), dtype=np.float32)  # wider than the 1280 ids the mask covers
    logits = values if kind == "numpy" else torch.from_numpy(values).to(getattr(torch, kind))
    mask_logits(logits, words)
    masked = logits if kind == "numpy" else logits.float().numpy()
    allowed = np.unpackbits(words.view(np.uint8), bitorder="little").reshape(3, -1).astype(bool)
    assert np.isinf(masked[:, 1280:]).all()
    assert np.array_equal(np.isinf(masked[:, :1280]), ~allowed)


def test_a_fenced_batch_row_is_masked_in_place_and_its_neighbours_left_alone(compiler) -> None:
    fence = compiler.compile(CALL_GRAMMAR)
    logits = torch.zeros(2, QWEN_VOCAB_SIZE)  # row 0 unfenced, row 1 fenced
    fence.apply(logits[1])
    assert torch.isfinite(logits[0]).all()
    assert torch.isfinite(logits[1]).sum() == 1 and logits[1, TOOL_CALL] == 0.0


# ---------------------------------------------------------------------------------------------- refusals


class _Dialect:
    """Only what markup_tokens reads from a dialect."""

    name = "fake"
    markup: tuple[str, ...] = ()
    single_token_markup: tuple[str, ...] = ()


def dialect(markup: tuple[str, ...], single: tuple[str, ...] = ()) -> type[_Dialect]:
    return type("FakeDialect", (_Dialect,), {"markup": markup, "single_token_markup": single})


def test_markup_tokens_maps_added_tokens_to_ids(compiler) -> None:
    markup = compiler.markup_tokens(dialect(("<tool_call>", "</tool_call>", "<function=")))
    assert dict(markup.single) == {"<tool_call>": TOOL_CALL, "</tool_call>": TOOL_CALL_END}
    assert markup.lark("<tool_call>") == f"<[{TOOL_CALL}]>" and markup.lark("<function=") == '"<function="'


def test_split_single_token_markup_refuses_the_dialect(compiler) -> None:
    split = r"needs '｜DSML｜' as one token, this tokenizer splits it into \d+"
    with pytest.raises(ConfigError, match=split) as err:
        compiler.markup_tokens(dialect(("｜DSML｜", "<tool_call>"), single=("｜DSML｜",)))
    assert "dialect fake" in err.value.message and err.value.hint.startswith("choose dialect ")


def test_markup_gluing_an_added_token_to_text_is_ambiguous(compiler) -> None:
    with pytest.raises(ConfigError, match="added token 151657"):
        compiler.markup_tokens(dialect(("<tool_call>\n",)))


def test_a_grammar_quoting_an_added_token_is_refused(compiler) -> None:
    with pytest.raises(ConfigError, match=UNSATISFIABLE) as err:
        compiler.compile(FenceGrammar('%llguidance {}\nstart: "x" "<tool_call>" "y"'))
    assert f"<[{TOOL_CALL}]>" in err.value.hint
    with pytest.raises(ConfigError, match=UNSATISFIABLE):
        compiler.compile(FenceGrammar('start: "x"', literals=("\n<tool_call>",)))


def test_schema_strings_mentioning_added_tokens_are_not_markup(compiler) -> None:
    schema = {"type": "object", "description": "wraps <tool_call> tags", "properties": {"a": {"type": "string"}}}
    fence = compiler.compile(FenceGrammar("%llguidance {}\nstart: %json " + json.dumps(schema)))
    assert fence.allowed_count() >= 1


def test_a_schema_llguidance_cannot_compile_is_an_invalid_request(compiler) -> None:
    bad = FenceGrammar('%llguidance {}\nstart: %json {"type": "string", "format": "no-such-format"}')
    with pytest.raises(InvalidRequest, match="no-such-format"):
        compiler.compile(bad)


def test_lark_quoted_strings_skips_regexes_comments_schemas_and_token_names() -> None:
    lark = (
        '%llguidance {"no_forcing": false}\n'
        '// a "comment"\n'
        'start: <think> "\\n" /[^"]*/ </think> "a\\"b" tail  # also "comment"\n'
        'tail: %json {"const": "in schema"} "\\u00e9"\n'
    )
    assert list(lark_quoted_strings(lark)) == ["\n", 'a"b', "é"]
