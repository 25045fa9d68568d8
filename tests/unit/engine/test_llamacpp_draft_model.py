"""A GGUF draft model on llama.cpp (engine/llamacpp/draft_model.py): greedy speculative output equals plain greedy
decoding bit for bit over long turns, drafting with the target itself (every draft right) or with another random
model of the same vocabulary (most drafts wrong), fenced or not; the draft's KV holds only real tokens after a
rejection and reuses a previous request's prefix; a draft with another vocabulary is refused at load.

The target runs with uniform_rows (F16 weights: a pad row joins a lone token), as a daemon with --draft-model
does (engines.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from tests.support.speculation import EDIT_GRAMMAR, check_edit, encode  # noqa: E402
from tests.support.tiny_models import tiny_qwen_tokenizer  # noqa: E402
from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.backend import ContextSettings, LlamaCppEngine  # noqa: E402
from zllm.engine.llamacpp.draft_model import LlamaDraftModel, draft_gguf, window_start  # noqa: E402
from zllm.engine.sampler import Sampler, SamplingConfig  # noqa: E402
from zllm.errors import ConfigError  # noqa: E402
from zllm.runtime.fence import FenceCompiler, sample_fenced  # noqa: E402
from zllm.runtime.speculative import SpeculationConfig, SpeculativeStep  # noqa: E402

TURN_TOKENS = 200
FILE = [(i * 7919) % 400 + 30 for i in range(90)]
PROMPTS = {
    "echo": [11, 12, 13, *FILE, 14, 15, *FILE[:20]],
    "free": [(i * 104729) % 450 + 25 for i in range(60)],
}
# always draft (no backoff): every step exercises the drafter
ALWAYS = SpeculationConfig(max_draft=5, max_backoff=0)
IM_END, END_OF_TEXT = 151645, 151643


@pytest.fixture(scope="module")
def target(tiny_gguf_path):
    engine = LlamaCppEngine(str(tiny_gguf_path("llama-bpe", dtype="f16")),
                            ContextSettings(cells=4096, threads=1, max_sequences=8, uniform_rows=True))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def drafts(target, tiny_gguf_path):
    """The target drafting for itself, and a random model of another architecture over the same vocabulary."""
    made = {"self": LlamaDraftModel(tiny_gguf_path("llama-bpe", dtype="f16"), target, threads=1),
            "other": LlamaDraftModel(tiny_gguf_path("qwen2", dtype="f16"), target, threads=1)}
    yield made
    for draft in made.values():
        draft.close()


def plain(engine, prompt, max_tokens, fence=None):
    """Greedy 1-token decoding (fenced when `fence`): the tokens, and the logits after each."""
    seq = engine.open()
    logits = engine.step([Row(seq, prompt)])[0]
    sampler, tokens, after = Sampler(SamplingConfig(temperature=0.0)), [], []
    while len(tokens) < max_tokens:
        tokens.append(int(sample_fenced(sampler, logits, fence).item()))
        if fence is not None:
            fence.advance(tokens[-1])
        if tokens[-1] in (IM_END, END_OF_TEXT):
            break
        logits = engine.step([Row(seq, [tokens[-1]])])[0]
        after.append(logits)
    engine.release(seq)
    return tokens, after


def speculative(engine, prompt, max_tokens, drafter, fence=None):
    """Greedy through the runtime's speculative step with `drafter`: the tokens, (tokens so far, logits) after each
    run, and the step (its stats)."""
    seq = engine.open()
    logits = engine.step([Row(seq, prompt)])[0]
    step = SpeculativeStep(engine, Sampler(SamplingConfig(temperature=0.0)), prompt, ALWAYS,
                           stop_token_ids=frozenset({IM_END, END_OF_TEXT}), drafter=drafter)
    tokens, after = [], []
    while len(tokens) < max_tokens:
        run = step.step(logits, seq, remaining=max_tokens - len(tokens), fence=fence)
        for token in run.tokens:
            tokens.append(token)
            if fence is not None:
                fence.advance(token)
        if run.logits is None or tokens[-1] in (IM_END, END_OF_TEXT):
            break
        logits = run.logits
        after.append((len(tokens), logits))
    engine.release(seq)
    return tokens, after, step


@pytest.mark.parametrize("turn", PROMPTS)
@pytest.mark.parametrize("kind", ["self", "other"])
def test_draft_model_greedy_is_plain_greedy_bit_for_bit(target, drafts, turn, kind) -> None:
    prompt = PROMPTS[turn]
    want, plain_logits = plain(target, prompt, TURN_TOKENS)
    drafter = drafts[kind].drafter_for(prompt)
    got, runs, step = speculative(target, prompt, TURN_TOKENS, drafter)
    assert got == want
    for emitted, logits in runs:
        assert np.array_equal(logits, plain_logits[emitted - 1]), f"logits after token {emitted} differ"
    stats = step.stats
    assert stats.drafted > 0
    if kind == "self":  # the target's own greedy continuation: every draft is right
        assert stats.accepted == stats.drafted and stats.steps < TURN_TOKENS / 3
    else:
        assert stats.accepted < stats.drafted
    # the draft's cells hold real tokens (prompt + emitted) and at most the last step's pending ones
    assert drafter._slot.tokens[:len(prompt) + len(got) - 1] == [*prompt, *got][:len(prompt) + len(got) - 1]


@pytest.mark.parametrize("kind", ["self", "other"])
def test_drafted_positions_stay_under_the_fence(target, drafts, kind) -> None:
    """A fenced turn (a JSON edit) with drafts: the same tokens as plain fenced decoding, a valid edit; drafts that
    the grammar forbids are cut before the verify (speculative._draft), and a verify's rows are masked."""
    compiler = FenceCompiler(tiny_qwen_tokenizer(), vocab_size=target.vocab_size,
                             stop_token_ids=frozenset({IM_END, END_OF_TEXT}))
    prompt = encode("Write the edit as JSON: " + '{"path": "src/app.py", "line": 42, "mode": "replace"}')
    want, _ = plain(target, prompt, 80, compiler.compile(EDIT_GRAMMAR))
    got, _, step = speculative(target, prompt, 80, drafts[kind].drafter_for(prompt), compiler.compile(EDIT_GRAMMAR))
    assert got == want and step.stats.drafted > 0
    text = tiny_qwen_tokenizer().decode([t for t in got if t not in (IM_END, END_OF_TEXT)])
    check_edit(text)


def test_rejected_drafts_are_rolled_back_and_a_next_turn_reuses_the_prefix(target, drafts) -> None:
    draft = drafts["other"]
    prompt = PROMPTS["free"]
    drafter = draft.drafter_for(prompt)
    first = drafter.propose(4)
    assert len(first) == 4 and drafter.cached == len(prompt) + 3  # the last draft token is never fed
    drafter.extend([first[0], first[1] + 1])  # the verifier took one draft token, then another token
    second = drafter.propose(3)
    sequence = [*prompt, first[0], first[1] + 1]
    assert drafter._slot.tokens[:len(sequence)] == sequence and drafter.cached == len(sequence) + 2
    assert len(second) == 3
    reply = [*sequence, *second]
    del drafter  # the request ended: its slot is free, its cells kept
    fed = draft.fed
    turn = [*reply, 7, 8, 9]  # the next turn: the conversation so far, then a new message
    draft.drafter_for(turn).propose(2)
    assert draft.fed - fed <= len(turn) - len(sequence) + 2, "the next turn fed its new tokens only"


def test_a_draft_from_scratch_proposes_what_an_incremental_one_does(target, tiny_gguf_path) -> None:
    """Greedy drafts do not depend on which cells were reused (a fresh draft model, nothing cached), nor on three
    live requests sharing two slots (each takes a slot back from another at its turn)."""
    fresh = LlamaDraftModel(tiny_gguf_path("qwen2", dtype="f16"), target, threads=1)
    reused = LlamaDraftModel(tiny_gguf_path("qwen2", dtype="f16"), target, threads=1, slots=2)
    try:
        prompts = [PROMPTS["echo"], PROMPTS["free"], PROMPTS["echo"][:50]]
        live = [reused.drafter_for(prompt) for prompt in prompts]
        for round_ in range(3):
            for prompt, drafter in zip(prompts, live):
                drafter.propose(5)
                drafter.extend([1, 2, 3 + round_])
                sequence = [*prompt, *[token for r in range(round_ + 1) for token in (1, 2, 3 + r)]]
                assert drafter.propose(4, tail=[5]) == fresh.drafter_for(sequence).propose(4, tail=[5])
        assert sum(drafter.owns for drafter in live) == 2
    finally:
        fresh.close()
        reused.close()


def test_a_draft_model_with_another_vocabulary_is_refused(target, tiny_gguf_path) -> None:
    with pytest.raises(ConfigError) as refused:
        LlamaDraftModel(tiny_gguf_path("llama", dtype="f16"), target, threads=1)
    assert "vocabulary" in refused.value.message and "same tokenizer" in refused.value.hint


def test_a_draft_model_directory_without_a_gguf_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="model.gguf"):
        draft_gguf(tmp_path)


def test_the_window_start_moves_in_quarter_steps() -> None:
    assert window_start(3072, 4096) == 0
    assert window_start(3073, 4096) == 2048  # past 3/4 of the window: at most half of it prefilled
    assert window_start(4096, 4096) == 2048 and window_start(4097, 4096) == 3072


def test_a_long_conversation_keeps_its_view_turn_after_turn(target, tiny_gguf_path) -> None:
    """Past the window the view starts later, and the next turns keep that start while they fit: each feeds only
    its new tokens."""
    draft = LlamaDraftModel(tiny_gguf_path("qwen2", dtype="f16"), target, threads=1, window=64)
    try:
        conversation = [*PROMPTS["free"]]  # 60 tokens: past 3/4 of 64
        for turn in range(3):
            fed = draft.fed
            drafter = draft.drafter_for(conversation)
            drafter.propose(2)
            assert drafter._slot.start == 32
            fed = draft.fed - fed - 1  # less the first draft token, fed after the sequence
            assert fed == len(conversation) - 32 if turn == 0 else fed <= 3
            conversation += [7 + turn, 8, 9]
            del drafter
    finally:
        draft.close()


def test_a_server_with_a_draft_model_decodes_with_the_kernels_that_verify(tmp_path) -> None:
    """engines.local_client: --draft-model alone (no --speculative) pads lone tokens as --speculative does, or
    verified drafts would differ from 1-token decoding in their last bits (F16/F32 weights)."""
    from tests.support.backends import tiny_gguf_model_dir
    from zllm.config import Settings
    from zllm.engines import local_client

    model_dir = tiny_gguf_model_dir("qwen3")
    client = local_client(model_dir, Settings(backend="llamacpp", threads=1, data_dir=tmp_path, state_dir=tmp_path,
                                              draft_model=str(model_dir / "model.gguf")), name="tiny", created=1)
    try:
        assert client.loaded.engine.settings.uniform_rows and client.speculation is not None
        assert isinstance(client.engine.draft_model, LlamaDraftModel)
    finally:
        client.close()
    assert client.loaded.drafts[0].ctx is None, "the draft model is closed with the served model"
