"""The llama.cpp backend against itself: a continued, shared, restored or batched sequence gives the logits a
fresh prefill of the same tokens gives.

llama.cpp's own run-to-run tolerance, measured here on the F32 tiny model: the same tokens fed in the same batch
shapes agree to ~1e-6 of the logits' scale (0.0 when the cells land in the same places; a unified pool may
place a sequence's cells elsewhere, which changes the attention's summation order) — asserted at 1e-4 for a
prefix shared by seq_cp or restored from state bytes. Feeding the same tokens in other batch shapes (one
120-token batch vs 50 + 50 + 20) changes the kernels' accumulation order: ≤ 2% of the scale, asserted, with
the same greedy token."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from zllm.engine.contract import Row  # noqa: E402
from zllm.engine.llamacpp.backend import ContextSettings, LlamaCppEngine  # noqa: E402

PROMPT = [(i * 7919) % 500 + 20 for i in range(120)]
SAME_SHAPES_TOLERANCE = 1e-4  # of max |logit| (see the module docstring)
SPLIT_TOLERANCE = 0.02  # of max |logit|, across batch shapes


def assert_same(a: np.ndarray, b: np.ndarray, tolerance: float = SAME_SHAPES_TOLERANCE) -> None:
    assert np.abs(a - b).max() <= tolerance * np.abs(b).max()
    assert np.array_equal(a.argmax(-1), b.argmax(-1))


@pytest.fixture(scope="module")
def engine(tiny_gguf_path):
    engine = LlamaCppEngine(str(tiny_gguf_path("llama-bpe")), ContextSettings(cells=2048, threads=1, max_sequences=16))
    yield engine
    engine.close()


def fed(engine, tokens, *splits):
    """A fresh sequence fed `tokens` in chunks ending at `splits`; (sequence, logits after the last token)."""
    seq, start = engine.open(), 0
    for stop in (*splits, len(tokens)):
        logits = engine.step([Row(seq, tokens[start:stop])])[0]
        start = stop
    return seq, logits


def test_a_shared_prefix_continues_exactly_as_a_fresh_sequence(engine) -> None:
    source, _ = fed(engine, PROMPT)
    shared = engine.share(source, 80)
    continued = engine.step([Row(shared, PROMPT[80:])])[0]
    fresh, reference = fed(engine, PROMPT, 80)
    assert_same(continued, reference)
    assert engine.length(shared) == len(PROMPT)
    for seq in (source, shared, fresh):
        engine.release(seq)


def test_exported_state_restores_exactly_after_a_crop(engine) -> None:
    source, _ = fed(engine, PROMPT)
    data = engine.export_state(source)
    assert len(data) > engine.bytes_per_token * len(PROMPT) * 0.9
    restored = engine.import_state(data, len(PROMPT))
    engine.crop(restored, 90)
    after_restore = engine.step([Row(restored, PROMPT[90:])])[0]
    fresh, reference = fed(engine, PROMPT, 90)
    assert_same(after_restore, reference)
    for seq in (source, restored, fresh):
        engine.release(seq)


def test_state_from_another_engine_restores_exactly(engine, tiny_gguf_path) -> None:
    """A restart: the state saved by one context is loaded by a new one over the same file."""
    source, _ = fed(engine, PROMPT, 100)
    data = engine.export_state(source)
    engine.release(source)
    other = LlamaCppEngine(str(tiny_gguf_path("llama-bpe")), ContextSettings(cells=1024, threads=1, max_sequences=4))
    try:
        restored = other.import_state(data, len(PROMPT))
        logits = other.step([Row(restored, [5])])[0]
    finally:
        other.close()
    fresh, _ = fed(engine, PROMPT, 100)
    reference = engine.step([Row(fresh, [5])])[0]
    assert_same(logits, reference)
    engine.release(fresh)


def test_refused_state_leaves_nothing_held(engine) -> None:
    free = engine.free_sequences
    source, _ = fed(engine, PROMPT)
    data = bytearray(engine.export_state(source))
    engine.release(source)
    with pytest.raises(Exception):
        engine.import_state(bytes(data[: len(data) // 2]), len(PROMPT))
    assert engine.free_sequences == free


def test_rows_batched_in_one_decode_equal_each_alone(engine) -> None:
    prompts = [PROMPT[:40], PROMPT[10:70], PROMPT[5:25]]
    alone = []
    for prompt in prompts:
        seq, logits = fed(engine, prompt)
        alone.append((seq, logits, engine.step([Row(seq, [7])])[0]))
    together = [engine.open() for _ in prompts]
    first = engine.step([Row(seq, prompt) for seq, prompt in zip(together, prompts)])
    second = engine.step([Row(seq, [7]) for seq in together])
    for (seq, logits, next_logits), a, b in zip(alone, first, second):
        scale = np.abs(logits).max()
        assert np.abs(a - logits).max() <= SPLIT_TOLERANCE * scale
        assert np.abs(b - next_logits).max() <= SPLIT_TOLERANCE * scale
        assert int(b.argmax()) == int(next_logits.argmax())
    for seq in [s for s, *_ in alone] + together:
        engine.release(seq)


def test_all_logits_rows_and_crop_serve_a_speculative_verify(engine) -> None:
    seq, _ = fed(engine, PROMPT[:60])
    rows = engine.step([Row(seq, PROMPT[60:66], all_logits=True)])[0]
    assert rows.shape == (6, engine.vocab_size)
    engine.crop(seq, 62)  # two drafted tokens accepted, the rest rejected
    again = engine.step([Row(seq, PROMPT[62:66], all_logits=True)])[0]
    scale = np.abs(rows).max()
    assert np.abs(again - rows[2:]).max() <= SPLIT_TOLERANCE * scale
    assert np.array_equal(again.argmax(-1), rows[2:].argmax(-1))
    engine.release(seq)


def test_full_prefill_in_one_batch_is_within_llama_cpp_tolerance(engine) -> None:
    one, whole = fed(engine, PROMPT)
    split, chunked = fed(engine, PROMPT, 50, 100)
    assert np.abs(whole - chunked).max() <= SPLIT_TOLERANCE * np.abs(whole).max()
    engine.release(one)
    engine.release(split)


def test_kv_bytes_are_estimated_from_the_gguf_without_loading_weights(tiny_gguf_path, engine) -> None:
    """The estimate behind --cache-budget-mb: it used llama_model_n_head on a vocab-only load, which aborts the
    process; it reads the metadata now, and agrees with what a context measures (F16 cells)."""
    path = str(tiny_gguf_path("llama-bpe"))
    estimate = LlamaCppEngine.estimate_bytes_per_token(path)
    assert estimate <= engine.bytes_per_token <= estimate + 16  # the state also holds a cell's position and ids
    assert not LlamaCppEngine.exact_attention_fits(path)  # 16-wide heads: Q8_0 rows are 32-element blocks


def test_exact_chunks_never_leave_a_one_token_ubatch() -> None:
    from zllm.engine.llamacpp.backend import _exact_chunks

    assert _exact_chunks(1, 512) == [(0, 1)]  # a lone token: padded in the decode itself
    assert _exact_chunks(513, 512) == [(0, 511), (511, 513)]
    assert _exact_chunks(1024, 512) == [(0, 512), (512, 1024)]
    for n in range(2, 40):
        spans = _exact_chunks(n, 4)
        assert spans[0][0] == 0 and spans[-1][1] == n and all(2 <= end - start <= 4 for start, end in spans)


def test_exact_mode_buries_released_cells_and_compacts_a_full_pool(tiny_gguf_path) -> None:
    """The mechanics of ContextSettings.exact on the tiny model (its 16-wide heads keep F16 cells, so not the
    bit-equality itself: tests/integration/test_llamacpp_exact_cache.py): two sequence ids are kept back, a
    released sequence's cells stay held (dead) until a decode finds no room, which compacts once and goes on,
    and a lone token's logits equal the same token's in a longer step's shape where placement cannot differ."""
    engine = LlamaCppEngine(str(tiny_gguf_path("llama-bpe")),
                            ContextSettings(cells=512, threads=1, max_sequences=5, exact=True))
    try:
        assert engine.free_sequences == 3
        first = engine.open()
        fed_logits = engine.step([Row(first, PROMPT[:100])])[0]
        other = engine.open()
        engine.step([Row(other, [(i * 31) % 500 + 20 for i in range(engine.cells - 160)])])  # 60 cells left
        engine.release(other)
        assert engine.compactions == 0  # dead cells: nothing freed below `first`'s continuation
        again = engine.open()
        engine.step([Row(again, PROMPT[:100])])  # room only once the dead cells are dropped
        assert engine.compactions == 1
        lone = engine.step([Row(engine.share(first, 99), PROMPT[99:100])])[0]  # one token: padded
        assert_same(lone, fed_logits, SPLIT_TOLERANCE)  # F16 cells on this model: kernels by shape
    finally:
        engine.close()
