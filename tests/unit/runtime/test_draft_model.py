"""A small draft model as the speculative drafter, on the tiny Qwen: greedy drafts equal a from-scratch greedy
decode of the draft model, its KV cache never keeps a rejected token and prefills the prompt once, greedy
speculative output equals the plain loop's (drafting with the target itself, or with another random model,
fenced or not), and a draft model with another vocabulary is refused at load."""

from __future__ import annotations

import copy
import dataclasses
import shutil
from contextlib import nullcontext

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.support.speculation import (
    EDIT_EXAMPLE,
    EDIT_GRAMMAR,
    FILE,
    STOP_IDS,
    Generation,
    ModelHooks,
    check_edit,
    echo_model,
    encode,
    plain,
    speculative,
)
from tests.support.tiny_models import (
    QWEN_VOCAB_SIZE,
    tiny_llama_dir,
    tiny_llama_tokenizer,
    tiny_qwen_dir,
    tiny_qwen_tokenizer,
)
from zllm.engine.torch.draft_model import DraftModel, DraftModelDrafter, load_draft_model
from zllm.engine.torch.runner import ModelRunner
from zllm.errors import ConfigError
from zllm.runtime.fence import FenceCompiler
from zllm.runtime.loop_guard import LoopGuard
from zllm.runtime.speculative import SpeculationConfig, SpeculativeStep

# always draft (no backoff after a rejection): every step exercises the drafter
ALWAYS = SpeculationConfig(max_draft=5, max_backoff=0)

# ------------------------------------------------------------------ fixtures and the driver


@pytest.fixture(autouse=True)
def inference_mode():
    with torch.inference_mode():  # as on the engine thread
        yield


@pytest.fixture(scope="module")
def self_draft(tiny_qwen) -> DraftModel:
    """The target drafting for itself: every greedy draft is what the target would pick."""
    return DraftModel.for_target(tiny_qwen, tiny_qwen.tokenizer)


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory) -> DraftModel:
    """A smaller (1 layer) random model with the tiny Qwen's shape and tokenizer, other weights."""
    path = tmp_path_factory.mktemp("draft")
    shutil.copytree(tiny_qwen_dir(), path, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.safetensors", "config.json", "generation_config.json"))
    config = AutoConfig.from_pretrained(tiny_qwen_dir(), num_hidden_layers=1, layer_types=["full_attention"])
    torch.manual_seed(99)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return load_draft_model(path, tiny_qwen_tokenizer(), device="cpu", dtype="float32", threads=1)


def drafted(draft: DraftModel, runner, prompt, max_tokens, *, config=ALWAYS,
            **options) -> tuple[Generation, SpeculativeStep]:
    """The shared speculative driver with `draft` as the drafter, always drafting unless `config` says
    otherwise; `options` as `speculative` takes them (fence, guard, on_step)."""
    return speculative(runner, prompt, max_tokens, config=config, drafter=draft.drafter_for(prompt), **options)


def greedy_reference(draft: DraftModel, tokens: list[int], limit: int) -> list[int]:
    """The draft model's greedy continuation of `tokens` from an empty cache, one decode step at a time."""
    runner, cache, out = draft.runner, draft.runner.new_cache(), []
    logits = runner.prefill(tokens, cache)
    for _ in range(limit):
        token = logits[:draft.proposable].argmax().view(1, 1)
        out.append(token.item())
        logits = runner.decode(token, cache)
    return out


def assert_cache_holds(drafter: DraftModelDrafter, tokens: list[int]) -> None:
    """The drafter's KV cache is exactly what a fresh prefill of `tokens` leaves."""
    runner, reference = drafter.model.runner, drafter.model.runner.new_cache()
    runner.prefill(tokens, reference)
    assert drafter.cache.get_seq_length() == drafter.cache_length == len(tokens)
    for layer, ref in zip(drafter.cache.layers, reference.layers):
        assert torch.allclose(layer.keys, ref.keys, atol=1e-5)
        assert torch.allclose(layer.values, ref.values, atol=1e-5)


class fed_tokens(ModelHooks):
    """Counts the tokens each forward of `model` is fed (prefill chunks, decode steps, verifies)."""

    def __init__(self, model):
        self.model, self.per_forward = model, []

    def _hooks(self) -> tuple:
        hook = lambda module, args: self.per_forward.append(args[0].shape[1])  # noqa: E731 - input_ids [1, n]
        return (self.model.get_input_embeddings().register_forward_pre_hook(hook),)


# ---------------------------------------------------------------------------------------------- the drafter


def test_drafts_are_the_draft_models_greedy_continuation_and_rejected_ones_never_stay(other_draft) -> None:
    """Through tails that change between calls, extends that accept part of a draft or none of it, and tokens
    added without a propose: every draft equals a from-scratch greedy decode, and after every extend the cache
    holds a prefix of the real sequence only."""
    prompt = (encode(FILE) * 2)[:30]
    drafter, sequence = other_draft.drafter_for(prompt), list(prompt)
    assert drafter.cache is None and len(drafter) == 30  # nothing is prefilled before the first propose

    def propose(limit, tail):
        draft = drafter.propose(limit, tail)
        assert draft == greedy_reference(other_draft, sequence + tail, limit)
        assert_cache_holds(drafter, sequence + tail + draft[:-1])  # the tail and fed drafts, until extend
        return draft

    def extend(tokens, *, real):
        drafter.extend(tokens)
        sequence.extend(tokens)
        assert len(drafter) == len(sequence) and drafter.cached_real == real
        assert_cache_holds(drafter, sequence[:real])

    draft = propose(4, [11])
    draft = propose(4, [12])  # another tail without an extend: the first tail's tokens are cropped
    draft = propose(4, [12])  # the same again: everything was fed, the tail's last token is fed again
    extend([12, draft[0], draft[1]], real=33)  # two drafts accepted: computed by the propose, kept
    extend([13, 14], real=33)  # emitted without a propose (a plain step): fed at the next one
    draft = propose(3, [])
    extend([draft[0], 15], real=36)  # the second draft token rejected: the first stays, 15 is new
    extend([], real=36)
    draft = propose(5, [draft[0] + 1, 16])
    extend([99], real=37)  # a tail the step did not emit after all: nothing after the sequence is kept
    propose(2, [])


def test_drafts_stop_at_the_draft_models_context_and_at_ids_it_cannot_embed(other_draft) -> None:
    prompt = encode(FILE)[:20]
    short = dataclasses.replace(other_draft, context_length=24)
    drafter = short.drafter_for(prompt)
    assert drafter.propose(0) == []
    assert len(drafter.propose(10, tail=[5])) == 3  # 20 + 1 tail + 3 = the draft model's 24 positions
    drafter.extend([5, 6, 7, 8])
    assert drafter.propose(10) == []
    blind = other_draft.drafter_for(prompt)
    blind.extend([QWEN_VOCAB_SIZE])  # an id past the draft's embedding (a target's padding row, sampled)
    assert blind.propose(4) == [] and blind.cache is None


def test_the_prompt_is_prefilled_once_in_chunks(tiny_qwen, runner, self_draft) -> None:
    """The first propose prefills the prompt in the runner's chunks; later ones feed only what is new: over a
    generation the draft model is fed each real token about once (+ rejected drafts), not the prompt per step."""
    chunked = dataclasses.replace(self_draft, runner=ModelRunner(tiny_qwen.model, prefill_chunk=16))
    code = encode(FILE)
    prompt = encode("Repeat this file exactly:\n") + code + encode("\nHere it is:\n")
    drafter = chunked.drafter_for(prompt)
    with fed_tokens(tiny_qwen.model) as fed:
        draft = drafter.propose(4, tail=[7])
    chunks = -(-(len(prompt) + 1) // 16)
    assert fed.per_forward == [16] * (chunks - 1) + [(len(prompt) + 1) % 16 or 16] + [1, 1, 1]
    assert drafter.forwards == chunks + 3 and len(draft) == 4

    # the target drafting for itself: one model, so the count below takes the target's own forwards out
    with echo_model(tiny_qwen.model, code, gaps=(code[5], code[17])), fed_tokens(tiny_qwen.model) as fed:
        got, spec = drafted(chunked, runner, prompt, 60)
    stats = spec.stats
    draft_fed = sum(fed.per_forward) - (len(prompt) + stats.steps + stats.drafted)  # less prefill and verifies
    assert stats.steps >= 10  # many proposes, one prefill: each token fed about once
    assert draft_fed <= len(prompt) + len(got.tokens) + stats.drafted + stats.steps


# ---------------------------------------------------------------------------------------------- in SpeculativeStep


def test_drafting_with_the_target_itself_accepts_every_draft(runner, self_draft) -> None:
    prompt = encode("<|im_start|>user\nWrite a haiku about caches.<|im_end|>\n<|im_start|>assistant\n")
    want = plain(runner, prompt, 40)
    got, spec = drafted(self_draft, runner, prompt, 40, config=SpeculationConfig())
    assert got == want
    assert spec.stats.drafted >= 30 and spec.stats.acceptance == 1.0
    assert spec.stats.steps <= 5  # drafts of 2, 4, 8, 12 (doubled while wholly accepted), then the last 9


@pytest.mark.parametrize("case", ["random", "echo-with-gaps"])
def test_another_draft_model_keeps_greedy_output_exact(runner, tiny_qwen, other_draft, case) -> None:
    """Random: the drafts are nearly always rejected. Echo: both models continue the file, each with its own
    random choice at the gaps, so runs of drafts are accepted and the gaps reject them."""
    code = encode(FILE)
    prompt = encode("Repeat this file exactly:\n") + code + encode("\nHere it is:\n")
    gaps = (code[5], code[13], code[22])
    echo = case == "echo-with-gaps"
    max_tokens = 60 if echo else 30  # random: a step per token, whatever was drafted
    with echo_model(tiny_qwen.model, code, gaps) if echo else nullcontext(), \
            echo_model(other_draft.runner.model, code, gaps) if echo else nullcontext():
        want = plain(runner, prompt, max_tokens)
        got, spec = drafted(other_draft, runner, prompt, max_tokens)
    assert got == want
    assert spec.stats.drafted >= 50
    if echo:
        assert 20 <= spec.stats.accepted < spec.stats.drafted and spec.stats.steps <= 30


def test_another_draft_model_keeps_fenced_greedy_output_exact(runner, tiny_qwen, other_draft) -> None:
    compiler = FenceCompiler(tiny_qwen_tokenizer(), vocab_size=QWEN_VOCAB_SIZE, stop_token_ids=STOP_IDS)
    example = encode(EDIT_EXAMPLE)
    prompt = encode("Emit the edit as JSON, like ") + example + encode(":\n")
    with echo_model(tiny_qwen.model, example, gaps=(example[4],)), \
            echo_model(other_draft.runner.model, example, gaps=(example[4], example[9])):
        want = plain(runner, prompt, 80, fence=compiler.compile(EDIT_GRAMMAR))
        got, spec = drafted(other_draft, runner, prompt, 80, fence=compiler.compile(EDIT_GRAMMAR), guard=LoopGuard())
    assert got == want and want.ending == "stop"
    check_edit(tiny_qwen.tokenizer.decode(got.tokens[:-1]))
    assert 0 < spec.stats.accepted < spec.stats.drafted


def test_the_draft_cache_follows_the_sequence_step_by_step(runner, tiny_qwen, other_draft) -> None:
    """After every step the draft cache holds a prefix of prompt + emitted tokens and nothing else: the tokens
    the step accepted were computed by its propose, the rejected ones are gone."""
    code = encode(FILE)
    prompt = encode("Copy:\n") + code
    lags = []

    def check(spec, tokens):
        drafter, sequence = spec.drafter, prompt + tokens
        assert len(drafter) == len(sequence) and drafter.cache_length == drafter.cached_real
        assert_cache_holds(drafter, sequence[:drafter.cached_real])
        lags.append(len(sequence) - drafter.cached_real)

    with echo_model(tiny_qwen.model, code, gaps=(code[9],)), echo_model(other_draft.runner.model, code):
        got, spec = drafted(other_draft, runner, prompt, 40, on_step=check)
        assert got == plain(runner, prompt, 40)
    assert max(lags) <= 1  # at most the step's last accepted draft token, which no propose feeds


# ---------------------------------------------------------------------------------------------- vocabulary


def test_a_draft_model_with_another_vocabulary_is_refused(tiny_qwen) -> None:
    with pytest.raises(ConfigError, match="tokenizer differs") as refused:
        load_draft_model(tiny_llama_dir(), tiny_qwen_tokenizer(), device="cpu", dtype="float32", threads=1)
    assert "same family" in refused.value.hint
    with pytest.raises(ConfigError, match="tokenizer differs"):
        DraftModel.for_target(tiny_qwen, tiny_llama_tokenizer())
    extended = copy.deepcopy(tiny_qwen_tokenizer())
    extended.add_tokens(["<zllm_only_in_the_target>"])
    with pytest.raises(ConfigError, match="1 of 151670 tokens"):
        DraftModel.for_target(tiny_qwen, extended)
