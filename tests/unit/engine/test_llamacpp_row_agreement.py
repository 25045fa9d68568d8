"""A speculating llama.cpp engine pads 1-token decodes only where its kernels need it (row_agreement.py).

F16 weights take another matmul kernel for 1 row than for 2+ (vec_dot vs tinyBLAS): a verify's rows differ
from 1-token decoding, so the engine pads (test_llamacpp_speculative_greedy.py holds the padded answers). Q4_1
weights take vec_dot at every row count: the engine measures that at load, pads nothing, and a speculating
engine's greedy answer is then the bits of a NON-speculating engine's (no pad anywhere), over long turns."""

from __future__ import annotations

import numpy as np
import pytest

lc = pytest.importorskip("llama_cpp")

from tests.unit.engine.test_llamacpp_speculative_greedy import (  # noqa: E402
    PROMPTS,
    Echo,
    longest_run,
    plain,
    speculative,
)
from zllm.engine.llamacpp.backend import ContextSettings, LlamaCppEngine  # noqa: E402
from zllm.engine.llamacpp.row_agreement import CHECKED_ROWS, agreeing_rows  # noqa: E402


def settings(uniform_rows: bool) -> ContextSettings:
    return ContextSettings(cells=4096, threads=1, max_sequences=8, uniform_rows=uniform_rows)


@pytest.fixture(scope="module")
def q4_1_path(tiny_gguf_path, tmp_path_factory):
    source = tiny_gguf_path("llama-bpe", dtype="f16")
    path = tmp_path_factory.mktemp("q4_1") / "model.gguf"
    params = lc.llama_model_quantize_default_params()
    params.ftype, params.nthread = lc.LLAMA_FTYPE_MOSTLY_Q4_1, 1
    assert lc.llama_model_quantize(str(source).encode(), str(path).encode(), params) == 0
    return path


@pytest.fixture(scope="module")
def engines(q4_1_path):
    speculating, plain_server = (LlamaCppEngine(str(q4_1_path), settings(uniform)) for uniform in (True, False))
    yield speculating, plain_server
    speculating.close()
    plain_server.close()


def test_f16_weights_need_the_pad(tiny_gguf_path) -> None:
    engine = LlamaCppEngine(str(tiny_gguf_path("llama-bpe", dtype="f16")), settings(False))
    try:
        assert agreeing_rows(engine, (2, 3, 4)) == 1  # 2 rows already differ from 1-token decoding
    finally:
        engine.close()
    padded = LlamaCppEngine(str(tiny_gguf_path("llama-bpe", dtype="f16")), settings(True))
    try:
        assert padded.step_rows == 2 and padded.verify_rows == 63
    finally:
        padded.close()


def test_quantized_weights_need_no_pad(engines) -> None:
    speculating, plain_server = engines
    assert speculating.step_rows == 1 and speculating.verify_rows == CHECKED_ROWS[-1]
    assert speculating.free_sequences == plain_server.free_sequences  # the pad's sequence id went back


@pytest.mark.parametrize("turn", PROMPTS)
def test_speculative_greedy_without_a_pad_is_a_plain_servers_greedy_bit_for_bit(engines, turn) -> None:
    speculating, plain_server = engines
    want, plain_logits = plain(plain_server, PROMPTS[turn])
    echoes = [Echo(PROMPTS[turn], want, gap=17 if turn == "echo" else 5)]
    if turn == "echo":  # drafts as long as the checked rows allow, wholly accepted
        echoes.append(Echo(PROMPTS[turn], want, gap=160))
    for drafter in (None, *echoes):
        got, runs, step = speculative(speculating, PROMPTS[turn], drafter)
        assert got == want
        for emitted, logits in runs:
            if emitted <= len(plain_logits):
                assert np.array_equal(logits, plain_logits[emitted - 1]), f"logits after token {emitted} differ"
        assert step.stats.drafted > 0
    if turn == "echo":
        assert longest_run(runs) == CHECKED_ROWS[-1], "a draft of verify_rows - 1 tokens was wholly accepted"
    assert step.stats.accepted >= 150 and step.stats.steps < len(want) / 2, "accepted in runs"
