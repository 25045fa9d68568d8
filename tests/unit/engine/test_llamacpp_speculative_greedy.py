"""Speculation never changes a greedy answer on llama.cpp: over long turns (300 tokens) on agent-like prompts,
the runtime's speculative step emits the tokens plain 1-token decoding emits, and every logits row it hands on
is the same bits as plain decoding's at that position (ContextSettings.uniform_rows: a pad row joins a lone
token, so no product has 1 row; decoding rows never share a ubatch of 64+ tokens with a prefill chunk).

Without uniform_rows a verify's rows differ from 1-token decoding's in their last bits (ggml's 1-row vec_dot vs
its 2+-row tinyBLAS), and greedy outputs drift apart once two candidates are that close: the bit check fails at
once, the token check on a long enough turn (the F16 default model: bench/speculative_llamacpp.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.backend import ContextSettings, LlamaCppEngine  # noqa: E402
from zllm.engine.sampler import Sampler, SamplingConfig  # noqa: E402
from zllm.runtime.speculative import SpeculationConfig, SpeculativeStep  # noqa: E402

TURN_TOKENS = 300
FILE = [(i * 7919) % 400 + 30 for i in range(90)]  # a "file" the turn reads, then rewrites
PROMPTS = {
    "echo": [11, 12, 13, *FILE, 14, 15, *FILE[:20]],  # rewrite a file just read: long drafts accepted
    "edit": [11, *FILE[:45], 16, *FILE[50:], 17, *FILE[:30]],  # the file with a line changed, then again
    "free": [(i * 104729) % 450 + 25 for i in range(60)],  # nothing to copy
}


@pytest.fixture(scope="module", params=["f16"])
def engine(request, tiny_gguf_path):
    engine = LlamaCppEngine(str(tiny_gguf_path("llama-bpe", dtype=request.param)),
                            ContextSettings(cells=4096, threads=1, max_sequences=8, uniform_rows=True))
    yield engine
    engine.close()


def plain(engine, prompt: list[int]) -> tuple[list[int], list[np.ndarray]]:
    """Greedy 1-token decoding: the tokens, and the logits after each."""
    seq = engine.open()
    logits = engine.step([Row(seq, prompt)])[0]
    tokens, after = [], []
    for _ in range(TURN_TOKENS):
        tokens.append(int(np.argmax(logits)))
        logits = engine.step([Row(seq, [tokens[-1]])])[0]
        after.append(logits)
    engine.release(seq)
    return tokens, after


class Echo:
    """A drafter that knows the answer (as a model echoing a file it read does), wrong at every `gap`-th token:
    drafts are accepted in long runs and rejected in between (a random-weight model copies nothing itself)."""

    def __init__(self, prompt: list[int], answer: list[int], gap: int):
        self.prompt_length, self.answer, self.gap, self.length = len(prompt), answer, gap, len(prompt)

    def __len__(self) -> int:
        return self.length

    def extend(self, tokens) -> None:
        self.length += len(list(tokens))

    def propose(self, limit: int, tail=()) -> list[int]:
        start = self.length - self.prompt_length + len(tail)
        return [token + 1 if (start + i) % self.gap == 0 else token
                for i, token in enumerate(self.answer[start:start + limit])]


def speculative(engine, prompt: list[int], drafter=None) -> tuple[list[int], list[tuple[int, np.ndarray]],
                                                                   SpeculativeStep]:
    """Greedy through the runtime's speculative step (prompt lookup unless `drafter`): the tokens, and (tokens so
    far, logits) after each run."""
    seq = engine.open()
    logits = engine.step([Row(seq, prompt)])[0]
    step = SpeculativeStep(engine, Sampler(SamplingConfig(temperature=0.0), None), prompt,
                           SpeculationConfig(min_ngram=1, max_backoff=2, gate=False), drafter=drafter)
    tokens, after = [], []
    while len(tokens) < TURN_TOKENS:
        run = step.step(logits, seq, remaining=TURN_TOKENS + 20)
        tokens.extend(run.tokens)
        logits = run.logits
        after.append((len(tokens), logits))
    engine.release(seq)
    return tokens[:TURN_TOKENS], after, step


def longest_run(runs: list[tuple[int, np.ndarray]]) -> int:
    """The most tokens one step emitted (a draft wholly accepted: its length + 1)."""
    return max(after - before for (before, _), (after, _) in zip([(0, None), *runs], runs))


@pytest.mark.parametrize("turn", PROMPTS)
def test_speculative_greedy_is_plain_greedy_bit_for_bit(engine, turn) -> None:
    want, plain_logits = plain(engine, PROMPTS[turn])
    # on the echo turn also drafts of up to 62 tokens wholly accepted (63 rows: the per-cell attention's last)
    echoes = [Echo(PROMPTS[turn], want, gap=17 if turn == "echo" else 5)]
    if turn == "echo":
        echoes.append(Echo(PROMPTS[turn], want, gap=160))
    for drafter in (None, *echoes):
        got, runs, step = speculative(engine, PROMPTS[turn], drafter)
        assert got == want
        for emitted, logits in runs:
            if emitted <= TURN_TOKENS:
                assert np.array_equal(logits, plain_logits[emitted - 1]), f"logits after token {emitted} differ"
        assert step.stats.drafted > 0, "drafts were verified"
    if turn == "echo":
        assert longest_run(runs) == 63, "a 62-token draft was wholly accepted"
    assert step.stats.accepted >= 150 and step.stats.steps < TURN_TOKENS / 2, "accepted in runs"


def test_a_decoding_row_beside_a_long_prefill_gets_the_bits_it_gets_alone(engine) -> None:
    """A verify beside another request's 100-token prefill chunk (a ubatch of 64+ tokens: the tiled attention
    kernel) answers as it does alone."""
    prompt, draft = PROMPTS["echo"], FILE[20:26]
    seq = engine.open()
    engine.step([Row(seq, prompt)])
    alone = engine.step([Row(seq, draft, all_logits=True)])[0]
    engine.crop(seq, len(prompt))
    other = engine.open()
    beside = engine.step([Row(seq, draft, all_logits=True), Row(other, PROMPTS["free"] * 2)])[0]
    assert np.array_equal(beside, alone)
    engine.release(seq)
    engine.release(other)
