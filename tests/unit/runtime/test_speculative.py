"""Prompt-lookup speculative decoding on the tiny Qwen: the same greedy output as the plain loop (echo-heavy and
not, fenced and not, stopping inside an accepted run, loop-guarded), a KV cache holding exactly prompt + fed
tokens after every step, grammar-valid sampled output, and accept/reject drawing exactly from p."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import numpy as np
import pytest
import torch

from tests.support.engine_run import run_to_the_end
from tests.support.speculation import (
    EDIT_EXAMPLE,
    EDIT_GRAMMAR,
    FILE,
    GREEDY,
    IM_END,
    STOP_IDS,
    check_edit,
    echo_model,
    encode,
    plain,
    speculative,
)
from tests.support.tiny_models import QWEN_VOCAB_SIZE, tiny_qwen_tokenizer
from zllm.engine.contract import Row
from zllm.engine.sampler import Sampler, SamplingConfig
from zllm.engine.torch.kv_layers import crop_to, working_cache
from zllm.engine.torch.runner import ModelRunner
from zllm.engine.verify import sample_from, sampled_accepts, sampling_probs
from zllm.kvcache import CacheConfig
from zllm.runtime.engine_loop import EngineLoop, EngineRequest
from zllm.runtime.fence import FenceCompiler
from zllm.runtime.loop_guard import LoopGuard, LoopGuardConfig
from zllm.runtime.prefix import build_prefix_cache
from zllm.runtime.speculative import CostGate, PromptLookup, SpeculationConfig, SpeculativeStep


@pytest.fixture(autouse=True)
def inference_mode():
    with torch.inference_mode():  # as on the engine thread
        yield


@pytest.fixture(scope="module")
def compiler() -> FenceCompiler:
    return FenceCompiler(tiny_qwen_tokenizer(), vocab_size=QWEN_VOCAB_SIZE, stop_token_ids=STOP_IDS)


# ---------------------------------------------------------------------------------------------- the drafter


def test_lookup_proposes_what_followed_the_longest_suffix_match() -> None:
    lookup = PromptLookup([1, 2, 3, 9, 2, 3, 4, 5, 7, 2, 3], max_ngram=3)
    assert lookup.propose(2) == [4, 5]  # "2 3" last followed by 4 (most recent occurrence wins)
    lookup.extend([4])
    # "2 3 4" ran into the end of the sequence: past it the text repeats with the period (5 tokens)
    assert lookup.propose(8) == [5, 7, 2, 3, 4, 5, 7, 2]
    assert PromptLookup([1, 2, 9, 3, 2]).propose(3) == [9, 3, 2]  # only "2" matches (n = 1)


def test_lookup_never_matches_the_suffix_itself_and_respects_limits() -> None:
    assert PromptLookup([5, 6, 7]).propose(4) == []
    assert PromptLookup([5, 6, 5, 6], min_ngram=2).propose(4) == [5, 6, 5, 6]
    assert PromptLookup([1, 2, 3, 1]).propose(0) == []
    assert PromptLookup([8, 1, 2, 3, 8], min_ngram=2).propose(3) == []  # "3 8" never seen; n = 1 not allowed


def test_lookup_matches_through_the_tail() -> None:
    lookup = PromptLookup([1, 2, 3, 4, 1])
    assert lookup.propose(3, tail=[2]) == [3, 4, 1]  # suffix "1 2" ends in the tail
    assert PromptLookup([7, 1]).propose(3, tail=[7]) == [1, 7, 1]  # on into the tail, then periodic


# ---------------------------------------------------------------------------------------------- greedy = plain


@pytest.mark.parametrize("case", ["echo", "echo-with-gaps", "random", "chat"])
def test_greedy_output_equals_the_plain_loop(runner, tiny_qwen, case) -> None:
    code = encode(FILE)
    prompt = encode("Repeat this file exactly:\n") + code + encode("\nHere it is:\n")
    gaps = {"echo": (), "echo-with-gaps": (code[5], code[17]), "random": None, "chat": None}[case]
    if case == "chat":
        prompt = encode("<|im_start|>user\nWrite a haiku about caches.<|im_end|>\n<|im_start|>assistant\n")
    with echo_model(tiny_qwen.model, code, gaps) if gaps is not None else nullcontext():
        want = plain(runner, prompt, 60)
        got, spec = speculative(runner, prompt, 60)
    assert got == want
    assert want.cache_length == len(prompt) + len(want.tokens) - 1
    if gaps is not None:
        assert spec.stats.accepted >= 20 and spec.stats.steps <= 40, "echoed text is accepted in runs"
        assert spec.stats.accepted < spec.stats.drafted or not gaps, "the model's own tokens reject drafts"


def test_the_cache_holds_exactly_the_fed_tokens(runner, tiny_qwen) -> None:
    """After rejections and an ending inside a run, a pooled working cache and a DynamicCache hold what a fresh
    prefill of prompt + fed tokens holds."""
    code = encode(FILE)
    prompt = encode("Copy:\n") + code
    state = runner.probe_kv_state()
    buffers = tuple(tuple(t.new_zeros(*t.shape[:-2], 40, t.shape[-1]) for t in layer) for layer in state)
    for cache in (runner.new_cache(), working_cache(runner.config, buffers, 0)):
        assert runner.can_crop(cache) or cache.get_seq_length() == 0
        with echo_model(tiny_qwen.model, code, gaps=(code[9],)):
            got, spec = speculative(runner, prompt, 45, cache=cache)
        assert spec.stats.accepted > 10 and spec.stats.accepted < spec.stats.drafted
        reference = runner.new_cache()
        runner.prefill(prompt + got.tokens[:-1], reference)
        assert cache.get_seq_length() == reference.get_seq_length() == len(prompt) + 44
        for layer, ref in zip(cache.layers, reference.layers):
            assert torch.allclose(layer.keys, ref.keys, atol=1e-5)
            assert torch.allclose(layer.values, ref.values, atol=1e-5)


def test_crop_to_rewinds_a_cache_for_the_next_forward(runner) -> None:
    ids = encode(FILE)
    cache, reference = runner.new_cache(), runner.new_cache()
    runner.prefill(ids[:10], reference)
    want = runner.decode(runner.as_input([ids[10]]), reference)
    runner.prefill(ids[:14], cache)
    crop_to(cache, 10)
    assert torch.allclose(runner.decode(runner.as_input([ids[10]]), cache), want, atol=1e-5)
    with pytest.raises(AssertionError):
        crop_to(cache, 12)


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_stop_token_and_budget_inside_an_accepted_run(runner, tiny_qwen, max_tokens) -> None:
    script = encode(" one two three four five six seven eight") + [IM_END]
    prompt = encode("Say:") + script + encode("\nAgain:")
    with echo_model(tiny_qwen.model, script):
        want = plain(runner, prompt, max_tokens)
        got, _ = speculative(runner, prompt, max_tokens)
        want_stop = plain(runner, prompt, 50)
        got_stop, spec = speculative(runner, prompt, 50)
    assert got == want and len(got.tokens) == max_tokens and got.ending == "length"
    assert got_stop == want_stop and got_stop.ending == "stop" and got_stop.tokens == script
    assert spec.stats.steps <= 3, "the stop token was reached inside an accepted run"


def test_loop_guard_bans_and_stops_as_in_the_plain_loop(runner, tiny_qwen) -> None:
    cycle = encode(" tick tock")
    prompt = encode("Clock:") + cycle * 3
    config = LoopGuardConfig(max_period=8, min_repeats=4, min_span=8, max_bans=2)
    with echo_model(tiny_qwen.model, cycle + cycle[:1]):
        want = plain(runner, prompt, 200, guard=LoopGuard(config))
        got, spec = speculative(runner, prompt, 200, guard=LoopGuard(config))
    assert want.ending == "repetition" and got == want
    assert spec.stats.accepted > 0


# ---------------------------------------------------------------------------------------------- fenced


@pytest.mark.parametrize("echo", [False, True])
def test_fenced_greedy_output_equals_the_plain_fenced_loop(runner, tiny_qwen, compiler, echo) -> None:
    example = encode(EDIT_EXAMPLE)
    prompt = encode("Emit the edit as JSON, like ") + example + encode(":\n")
    with echo_model(tiny_qwen.model, example, gaps=(example[4],)) if echo else nullcontext():
        want = plain(runner, prompt, 80, fence=compiler.compile(EDIT_GRAMMAR))
        got, spec = speculative(runner, prompt, 80, fence=compiler.compile(EDIT_GRAMMAR), guard=LoopGuard())
    assert got == want and want.ending == "stop"
    check_edit(tiny_qwen.tokenizer.decode(got.tokens[:-1]))
    assert spec.stats.accepted > (8 if echo else 0), "grammar-forced keys (and the echoed example) are drafts"


@pytest.mark.parametrize("seed", range(12))
def test_fenced_sampled_output_is_always_valid(runner, tiny_qwen, compiler, seed) -> None:
    example = encode(EDIT_EXAMPLE)
    prompt = encode("Emit the edit as JSON, like ") + example + encode(":\n")
    sampling = SamplingConfig(temperature=1.0, top_p=0.95, seed=seed)
    gaps = (example[4], example[9])  # the path and the number are the model's (random) choice
    with echo_model(tiny_qwen.model, example, gaps=gaps) if seed % 2 else nullcontext():
        got, spec = speculative(runner, prompt, 80, sampling, fence=compiler.compile(EDIT_GRAMMAR))
    assert got.ending == "stop"
    check_edit(tiny_qwen.tokenizer.decode(got.tokens[:-1]))
    assert spec.stats.accepted > 0


def test_seeded_speculative_sampling_is_reproducible(runner) -> None:
    prompt = encode("Repeat: ") + encode(FILE) * 2
    sampling = SamplingConfig(temperature=0.8, top_k=20, seed=7)
    first, _ = speculative(runner, prompt, 30, sampling)
    again, _ = speculative(runner, prompt, 30, sampling)
    assert first == again


# ---------------------------------------------------------------------------------------------- distribution

CONFIGS = [SamplingConfig(0.7, seed=1), SamplingConfig(1.0, top_k=4, seed=2), SamplingConfig(1.3, top_p=0.8, seed=3)]


# the verifier's arithmetic on both kinds of logits: torch tensors (torch backend), numpy arrays (llama.cpp)
KINDS = ["torch", "numpy"]


def as_kind(tensor: torch.Tensor, kind: str):
    return tensor if kind == "torch" else tensor.numpy().copy()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", CONFIGS)
def test_sampling_probs_is_what_the_sampler_draws(config, kind) -> None:
    logits = as_kind(torch.randn(12, generator=torch.Generator().manual_seed(5)) * 2, kind)
    sampler, draws = Sampler(config, "cpu" if kind == "torch" else None), 6000
    counts = torch.bincount(torch.tensor([int(sampler(logits).item()) for _ in range(draws)]), minlength=12)
    assert torch.allclose(counts / draws, torch.as_tensor(sampling_probs(logits, config)), atol=0.025)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", CONFIGS)
def test_accept_reject_emits_tokens_distributed_as_p(config, kind) -> None:
    """Two draft positions on fixed rows: the first emitted token follows p0 whatever the draft, and given the
    first draft token was accepted the second follows p1. Draft tokens likely, unlikely and outside top-k/p."""
    rows = torch.randn(2, 12, generator=torch.Generator().manual_seed(11)) * 2
    rows[:, 3] = float("-inf")  # a fence-masked token
    rows = as_kind(rows, kind)
    p0, p1 = (torch.as_tensor(sampling_probs(rows[i], config)) for i in range(2))
    generator = torch.Generator().manual_seed(config.seed) if kind == "torch" else np.random.default_rng(config.seed)
    for draft in ([int(p0.argmax()), int(p1.argmin())], [int(p0.argmin()), int(p1.argmax())]):
        first, second = torch.zeros(12), torch.zeros(12)
        for _ in range(6000):
            accepted, residual = sampled_accepts(rows, draft, config, generator)
            if accepted == 0:
                first[int(sample_from(residual, generator).item())] += 1
                continue
            first[draft[0]] += 1
            second[draft[1] if accepted == 2 else int(sample_from(residual, generator).item())] += 1
        assert torch.allclose(first / first.sum(), p0, atol=0.025)
        assert first[3] == 0 and second[3] == 0
        if second.sum() > 2000:
            assert torch.allclose(second / second.sum(), p1, atol=0.035)



class ConstantModel:
    """A runner whose logits are the same row at every position, over a cache that only counts tokens: every
    emitted token must then be an independent draw from that row's p, whatever was drafted or rejected."""

    step_rows = 1
    verify_rows = 1 << 30

    def __init__(self, row: torch.Tensor):
        self.row = row

    def verify(self, token_ids, cache) -> torch.Tensor:
        cache.length += len(token_ids)
        return self.row.repeat(len(token_ids), 1)

    def decode(self, token, cache) -> torch.Tensor:
        return self.verify([token.item()], cache)[0]

    # the engine seam (engine/contract.py), as SpeculativeStep uses it
    def step(self, rows) -> list[torch.Tensor]:
        return [self.verify(row.token_ids, row.seq) for row in rows]

    @staticmethod
    def length(cache) -> int:
        return cache.get_seq_length()

    @staticmethod
    def crop(cache, length: int) -> None:
        cache.crop(length - cache.get_seq_length())


class CountingCache:
    length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        self.length += tokens_to_remove


@pytest.mark.parametrize("config", CONFIGS)
def test_speculative_steps_emit_tokens_distributed_as_p(config) -> None:
    row = torch.randn(12, generator=torch.Generator().manual_seed(3)) * 2
    p, favourite = sampling_probs(row, config), int(row.argmax())
    always_draft = SpeculationConfig(max_draft=4, min_ngram=1, max_backoff=0)
    spec = SpeculativeStep(ConstantModel(row), Sampler(config), [favourite] * 4, always_draft)
    cache, emitted = CountingCache(), []
    while len(emitted) < 8000:
        emitted += spec.step(row.clone(), cache, remaining=100).tokens
    assert spec.stats.accepted > 1000 and spec.stats.accepted < spec.stats.drafted
    frequencies = torch.bincount(torch.tensor(emitted), minlength=12) / len(emitted)
    assert torch.allclose(frequencies, p, atol=0.02)


class PaddingModel(ConstantModel):
    """ConstantModel on an engine that computes 2 rows per step anyway (llama.cpp with uniform rows)."""

    step_rows = 2


@pytest.mark.parametrize("model", [ConstantModel, PaddingModel])
def test_a_step_with_no_draft_guesses_one_token_where_the_engine_pads_anyway(model) -> None:
    """No 3-gram repeats: prompt lookup drafts nothing. A padding engine's step verifies the token that followed
    the last one's latest occurrence instead of a pad, and a wrong guess costs no backoff."""
    row = torch.zeros(12)
    row[5] = 1.0  # greedy emits 5, 5, 5 ...
    spec = SpeculativeStep(model(row), Sampler(GREEDY), [5, 7, 1, 2], SpeculationConfig(max_backoff=4))
    cache = CountingCache()
    plan = spec.plan(row.clone(), remaining=50)
    if model is ConstantModel:
        assert plan.draft == [] and not plan.guess
        return
    assert plan.guess and plan.draft == [7]  # what followed 5 in the prompt: wrong here
    run = spec.resolve(plan, spec.runner.step([Row(cache, plan.feed, all_logits=True)])[0], cache)
    assert run.tokens == [5] and spec._skip == 0 and spec.stats.drafted == 1
    emitted = run.tokens
    while len(emitted) < 20:
        emitted += spec.step(row.clone(), cache, remaining=50).tokens
    assert emitted[:20] == [5] * 20 and spec.stats.accepted > 10  # 5 follows 5 once it has been seen


class Fives:
    """A drafter that always proposes 5s (what ConstantModel's greedy row emits), except one wrong token (9) at
    draft position `wrong_at` of its `wrong_call`-th proposal."""

    def __init__(self, wrong_call: int = -1, wrong_at: int = 0):
        self.calls, self.wrong_call, self.wrong_at, self.length = 0, wrong_call, wrong_at, 0

    def __len__(self) -> int:
        return self.length

    def extend(self, tokens) -> None:
        self.length += len(list(tokens))

    def propose(self, limit: int, tail=()) -> list[int]:
        self.calls += 1
        draft = [5] * limit
        if self.calls == self.wrong_call and self.wrong_at < limit:
            draft[self.wrong_at] = 9
        return draft


def draft_lengths(model, drafter, steps: int = 8) -> list[int]:
    spec = SpeculativeStep(model, Sampler(GREEDY), [5] * 8, SpeculationConfig(max_draft=12), drafter=drafter)
    cache, lengths = CountingCache(), []
    for _ in range(steps):
        plan = spec.plan(model.row.clone(), remaining=100)
        lengths.append(len(plan.draft))
        spec.resolve(plan, model.step([Row(cache, plan.feed, all_logits=True)])[0], cache)
    return lengths


def test_a_draft_doubles_while_accepted_and_restarts_short_after_a_rejection() -> None:
    row = torch.zeros(12)
    row[5] = 1.0  # greedy emits 5, 5, 5 ...
    assert draft_lengths(ConstantModel(row), Fives()) == [2, 4, 8, 12, 12, 12, 12, 12]
    # the 4th draft (12 tokens) is rejected at its 4th token: 3 accepted, the next draft 4, then doubling again
    assert draft_lengths(ConstantModel(row), Fives(wrong_call=4, wrong_at=3)) == [2, 4, 8, 12, 4, 8, 12, 12]


class ShortVerifyModel(ConstantModel):
    """An engine whose verify keeps 1-token steps' bits up to 3 tokens (llama.cpp's Q4_K over F16 cells)."""

    verify_rows = 3


def test_a_draft_never_exceeds_the_engines_verify_rows() -> None:
    row = torch.zeros(12)
    row[5] = 1.0
    assert draft_lengths(ShortVerifyModel(row), Fives()) == [2] * 8


# ---------------------------------------------------------------------------------------------- in the engine loop

PATCHED = "speculation" in {field.name for field in dataclasses.fields(EngineRequest)}


@pytest.mark.skipif(not PATCHED, reason="the engine_loop.py integration patch is not applied yet")
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("ending", ["length", "stop"])
def test_the_engine_loop_streams_the_plain_output_and_keeps_the_plain_cache(tiny_qwen, cached, ending) -> None:
    """A stop token accepted inside a run: the tokens fed after it are cropped before the cache is kept."""
    words = encode(" one two three four five six seven eight nine ten eleven twelve") + [IM_END]
    script = encode(FILE) if ending == "length" else words
    prompt = encode("Repeat this file exactly:\n") + script + encode("\nHere it is:\n")
    gaps = (script[5], script[17]) if ending == "length" else ()
    runs = {}
    with echo_model(tiny_qwen.model, script, gaps):
        for speculation in (None, SpeculationConfig(min_ngram=1)):
            runs[speculation is not None] = engine_run(tiny_qwen, prompt, speculation, cached)
    assert runs[True] == runs[False]
    events, kept = runs[True]
    emitted = events[-1].usage.completion_tokens
    assert events[-1].reason.value == ending and emitted == (len(script) if ending == "stop" else 50)
    assert kept is None or len(kept) == len(prompt) + emitted - 1  # prompt + every token but the last, as plain


def engine_run(tiny_qwen, prompt: list[int], speculation, cached: bool):
    runner = ModelRunner(tiny_qwen.model)
    config = CacheConfig(device_budget_bytes=64 << 20)
    prefix_cache = build_prefix_cache(tiny_qwen, config) if cached else None
    engine = EngineLoop(runner, tiny_qwen.tokenizer, STOP_IDS, prefix_cache=prefix_cache)
    events = run_to_the_end(engine, prompt_ids=tuple(prompt), sampling=GREEDY, max_tokens=50, speculation=speculation)
    kept = prefix_cache.graph.entries["r"].tokens if cached else None
    engine.shutdown()
    return events, kept


# ---------------------------------------------------------------------------------------------- the cost gate


def test_the_gate_drafts_only_where_the_expected_tokens_pay_for_the_rows() -> None:
    quantized = CostGate(row_cost=0.6, step_rows=1)  # Q4_1 on a CPU: every verified row costs 0.6 of a step
    quantized.counts["short"] = [1.0, 9.0]  # p = 0.1
    assert quantized.draft_length(12, "short") == 0
    quantized.counts["long"] = [99.0, 1.0]  # p = 0.99
    assert 4 <= quantized.draft_length(62, "long") <= 16  # long drafts' rows cost more than they add
    padded = CostGate(row_cost=0.2, step_rows=2)  # F16 padded: a 1-token draft takes the pad row's place
    padded.counts["short"] = [1.0, 9.0]
    assert padded.draft_length(12, "short") == 1
    padded.counts["long"] = [99.0, 1.0]
    assert padded.draft_length(62, "long") > 16
    # over 8.5K cells each row also attends to them all, twice its products' cost (the default model)
    long_conversation = CostGate(row_cost=0.2, step_rows=2, cell_cost=2.56e-4)
    long_conversation.counts["long"] = [99.0, 1.0]
    assert 2 <= long_conversation.draft_length(62, "long", cells=8500) <= 10
    assert padded.draft_length(1, "guess") == 1  # the pad row's place: free over a short sequence
    assert long_conversation.draft_length(1, "guess", cells=8500) == 0  # a row attending to 8.5K cells is not


class ScriptModel:
    """A runner whose greedy continuation of position j is text[j + 1], over a CountingCache: the answer is
    fixed, and a draft is accepted exactly where prompt lookup guessed the script. Measures its rows' cost as a
    llama.cpp engine would (verify_row_cost)."""

    step_rows = 1
    verify_rows = 1 << 30

    def __init__(self, text: list[int], row_cost: float):
        self.text, self.verify_row_cost = text, row_cost

    def step(self, rows) -> list[torch.Tensor]:
        results = []
        for row in rows:
            start, row.seq.length = row.seq.length, row.seq.length + len(row.token_ids)
            logits = torch.zeros(len(row.token_ids), 256)
            for i in range(len(row.token_ids)):
                logits[i, self.text[start + i + 1]] = 1.0
            results.append(logits if row.all_logits else logits[-1])
        return results

    length, crop = staticmethod(ConstantModel.length), staticmethod(ConstantModel.crop)


def test_the_gate_stops_drafting_a_turn_with_nothing_to_copy_and_resumes_on_a_long_match() -> None:
    """A small alphabet repeats 3-grams whose next token is a 1-in-6 guess (drafts fail), then a 100-token
    copy of the prompt (long matches, drafts accepted): the gate cuts the failing drafts and drafts the copy
    (no backoff: the gate alone)."""
    generator = np.random.default_rng(7)
    source = generator.integers(50, 250, 120).tolist()  # a "file" in the prompt
    noise = generator.integers(1, 7, 150).tolist()
    prompt = [*source, 9]
    text = [*prompt, *noise, *source[10:110], 0]

    def run(gate: bool) -> tuple[list[int], int, SpeculativeStep]:
        model = ScriptModel(text, row_cost=0.6)  # Q4_1 on a CPU: a short match's coin toss never pays
        spec = SpeculativeStep(model, Sampler(GREEDY), prompt, SpeculationConfig(gate=gate, max_backoff=0))
        cache, emitted, drafted_in_noise = CountingCache(), [], 0
        cache.length = len(prompt) - 1  # prefilled but for the last token, whose logits start the turn
        logits = model.step([Row(cache, [prompt[-1]])])[0]
        while len(emitted) < len(noise) + 100:
            run = spec.step(logits, cache, remaining=len(noise) + 100 - len(emitted))
            emitted += run.tokens
            logits = run.logits
            if len(emitted) <= len(noise):
                drafted_in_noise = spec.stats.drafted
        return emitted, drafted_in_noise, spec

    plain, drafted_ungated, _ = run(gate=False)
    gated, drafted_gated, spec = run(gate=True)
    assert gated == plain == text[len(prompt):len(prompt) + len(noise) + 100]
    assert spec.gate is not None and spec.stats.gated > 0
    assert drafted_gated < drafted_ungated / 3, (drafted_gated, drafted_ungated)
    assert spec.stats.accepted >= 80, "the copy was drafted and accepted"


def test_no_gate_where_the_engine_measures_no_row_cost_or_a_draft_model_drafts() -> None:
    row = torch.zeros(12)
    assert SpeculativeStep(ConstantModel(row), Sampler(GREEDY), [1, 2]).gate is None
    gated = ScriptModel([0] * 8, row_cost=0.3)
    assert SpeculativeStep(gated, Sampler(GREEDY), [1, 2]).gate is not None
    assert SpeculativeStep(gated, Sampler(GREEDY), [1, 2], drafter=Fives()).gate is None
    assert SpeculativeStep(gated, Sampler(GREEDY), [1, 2], SpeculationConfig(gate=False)).gate is None


def test_fence_masks_are_computed_for_the_tokens_the_gate_keeps_only(compiler, monkeypatch) -> None:
    """A fenced draft is cut by the cost gate before anything masks it: a mask is a grammar step over the whole
    vocabulary, and a 12-token draft the gate cuts to 1 needs 1 (the masks' rows = the verified draft's)."""
    from zllm.dialects.base import FenceGrammar
    from zllm.runtime.fence import Fence

    class WideScript(ScriptModel):  # the fence's vocabulary
        def step(self, rows) -> list[torch.Tensor]:
            results = []
            for row in rows:
                start, row.seq.length = row.seq.length, row.seq.length + len(row.token_ids)
                logits = torch.zeros(len(row.token_ids), QWEN_VOCAB_SIZE)
                for i in range(len(row.token_ids)):
                    logits[i, self.text[start + i + 1]] = 1.0
                results.append(logits if row.all_logits else logits[-1])
            return results

    masked: list[int] = []
    real_masks = Fence.draft_masks
    monkeypatch.setattr(Fence, "draft_masks", lambda self, draft: masked.append(len(draft)) or real_masks(self, draft))
    source = list(range(100, 140))
    prompt = [*source, 9, *source[:20]]
    text = [*prompt, *source[20:]]
    model = WideScript(text, row_cost=0.6)  # Q4_1: a long match pays 1 drafted token at the prior's acceptance
    spec = SpeculativeStep(model, Sampler(GREEDY), prompt, SpeculationConfig(max_draft=12, first_draft=12))
    fence = compiler.compile(FenceGrammar("%llguidance {}\nstart: <[*]>*"))
    cache = CountingCache()
    cache.length = len(prompt) - 1
    logits = model.step([Row(cache, [prompt[-1]])])[0]
    plan = spec.plan(logits, remaining=15, fence=fence)
    assert spec.stats.gated == 1 and 1 <= len(plan.draft) < 12, "the gate cut a long draft"
    assert masked == [len(plan.draft)] and plan.masks.shape[0] == len(plan.draft)
