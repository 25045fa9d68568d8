"""Packed forwards (engine/torch/packed.py): several rows' tokens in one forward give each row exactly the logits and
the KV it would get from its own forward, whatever mix of cache states and token counts the batch holds, and no
row ever sees another row's tokens. A model that cannot be packed (DeepSeek's MLA) is detected, and the runner's
per-row fallback serves the same rows correctly."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from tests.support.deepseek_models import tiny_deepseek_dir
from tests.support.glm_models import tiny_glm_dir
from zllm.engine.torch.kv_layers import working_cache
from zllm.engine.torch.loader import load_model
from zllm.engine.torch.packed import Segment, packed_forward, supports_packing, use_packed_attention
from zllm.engine.torch.runner import ModelRunner

ATOL = 1e-4  # fp32: separate and packed forwards differ only in matmul shapes


@dataclass(frozen=True)
class Row:
    """One row of a continuous batch: `prefix` tokens already in its cache, `new` tokens fed this step."""

    name: str
    prefix: int
    new: int
    all_logits: bool = False


# what one engine step mixes: a decode, a speculative verify, a new prompt's first chunk, a later chunk
ROWS = (
    Row("decode over a long cached prefix", prefix=300, new=1),
    Row("speculative verify", prefix=40, new=5, all_logits=True),
    Row("cold prefill chunk", prefix=0, new=24),
    Row("prefill chunk appended to a cached prefix", prefix=30, new=17),
)


@pytest.fixture(scope="module")
def tiny_glm():
    return load_model(tiny_glm_dir(), device="cpu", dtype="float32", threads=1)


@pytest.fixture(scope="module")
def tiny_deepseek():
    return load_model(tiny_deepseek_dir(), device="cpu", dtype="float32", threads=1)


@pytest.fixture(params=["tiny_qwen", "tiny_llama", "tiny_glm"])
def runner(request) -> ModelRunner:
    """A packing runner: it switched the model to the packed attention (without it, packed_forward's rows would
    attend to their new tokens only, so every test here first checks `runner.packing`)."""
    return ModelRunner(request.getfixturevalue(request.param).model)


def row_tokens(vocab_size: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(cached prefix, new tokens) per row of ROWS; ids below 1000 exist in every tiny vocabulary."""
    rng = random.Random(seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(3, min(vocab_size, 1000)) for _ in range(n)]

    return [(draw(row.prefix), draw(row.new)) for row in ROWS]


def new_cache(runner: ModelRunner, kind: str, row: Row):
    """`working` caches are sized so that multi-token rows outgrow their buffers inside the packed forward."""
    if kind == "dynamic":
        return runner.new_cache()
    state = runner.probe_kv_state()  # [1, kv_heads, 1, head_dim] per tensor
    capacity = max(row.prefix, 1) + max(1, row.new // 2)
    buffers = tuple(tuple(t.new_zeros(*t.shape[:-2], capacity, t.shape[-1]) for t in layer) for layer in state)
    return working_cache(runner.config, buffers, 0)


def cached_rows(runner: ModelRunner, kind: str, tokens) -> list:
    """One cache per row holding its prefix, filled the way the engine fills it (a prefill)."""
    caches = []
    for row, (prefix, _) in zip(ROWS, tokens):
        cache = new_cache(runner, kind, row)
        if prefix:
            runner.prefill(prefix, cache)
        caches.append(cache)
    return caches


def separate(runner: ModelRunner, kind: str, tokens) -> tuple[list[torch.Tensor], list]:
    """Each row's logits from its own ordinary forward, and the caches those forwards leave."""
    caches = cached_rows(runner, kind, tokens)
    logits = []
    for row, (_, new), cache in zip(ROWS, tokens, caches):
        out = runner.model(input_ids=runner.as_input(new), cache=cache, use_cache=True).logits[0]
        logits.append(out if row.all_logits else out[-1])
    return logits, caches


def packed(runner: ModelRunner, kind: str, tokens) -> tuple[list[torch.Tensor], list]:
    caches = cached_rows(runner, kind, tokens)
    segments = [Segment(cache, new, all_logits=row.all_logits) for row, (_, new), cache in zip(ROWS, tokens, caches)]
    return packed_forward(runner.model, segments), caches


def assert_rows_equal(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for row, a, b in zip(ROWS, got, want):
        assert a.shape == b.shape, row.name
        torch.testing.assert_close(a, b, atol=ATOL, rtol=ATOL, msg=lambda m, name=row.name: f"{name}: {m}")


def assert_caches_equal(got: list, want: list) -> None:
    for row, a, b in zip(ROWS, got, want):
        assert a.get_seq_length() == b.get_seq_length() == row.prefix + row.new, row.name
        for layer_a, layer_b in zip(a.layers, b.layers):
            torch.testing.assert_close(layer_a.keys, layer_b.keys, atol=ATOL, rtol=ATOL)
            torch.testing.assert_close(layer_a.values, layer_b.values, atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("kind", ["working", "dynamic"])
def test_a_packed_forward_equals_separate_forwards(runner, kind) -> None:
    assert runner.packing, "the probe must find these models packable"
    tokens = row_tokens(runner.config.vocab_size, seed=1)
    with torch.inference_mode():
        want_logits, want_caches = separate(runner, kind, tokens)
        got_logits, got_caches = packed(runner, kind, tokens)
        assert_rows_equal(got_logits, want_logits)
        assert_caches_equal(got_caches, want_caches)
        # the rows go on from what the packed forward appended: a second packed step still equals separate ones
        follow = [[7], [8, 9], [10], [11, 12, 13]]
        again = packed_forward(runner.model, [Segment(c, f, all_logits=r.all_logits)
                                              for r, c, f in zip(ROWS, got_caches, follow)])
        alone = [runner.model(input_ids=runner.as_input(f), cache=c, use_cache=True).logits[0]
                 for c, f in zip(want_caches, follow)]
        assert_rows_equal(again, [a if r.all_logits else a[-1] for r, a in zip(ROWS, alone)])


def test_forward_rows_packs_into_one_model_call(runner) -> None:
    assert runner.packing
    tokens = row_tokens(runner.config.vocab_size, seed=2)
    calls = []
    with torch.inference_mode():
        caches = cached_rows(runner, "working", tokens)
        hook = runner.model.register_forward_hook(lambda module, args, output: calls.append(1))
        try:
            got = runner.forward_rows([Segment(c, new, all_logits=r.all_logits)
                                       for r, (_, new), c in zip(ROWS, tokens, caches)])
        finally:
            hook.remove()
        want, _ = separate(runner, "working", tokens)
    assert len(calls) == 1
    assert_rows_equal(got, want)


def test_no_row_sees_another_rows_tokens(runner) -> None:
    """Change one row's new tokens, then another row's cached prefix: every other row's logits stay the same."""
    assert runner.packing
    tokens = row_tokens(runner.config.vocab_size, seed=3)
    other = row_tokens(runner.config.vocab_size, seed=4)
    with torch.inference_mode():
        base, _ = packed(runner, "working", tokens)
        for changed, part in ((2, 1), (0, 0), (3, 0)):  # cold chunk's tokens, decode row's prefix, appended prefix
            perturbed = list(tokens)
            pair = list(perturbed[changed])
            pair[part] = other[changed][part]
            perturbed[changed] = tuple(pair)
            got, _ = packed(runner, "working", perturbed)
            assert not torch.allclose(got[changed], base[changed], atol=1e-3), f"no effect on {ROWS[changed].name}"
            for i, (a, b) in enumerate(zip(got, base)):
                if i != changed:
                    assert torch.allclose(a, b, atol=1e-6, rtol=1e-6), f"{ROWS[i].name} saw {ROWS[changed].name}"


@pytest.mark.parametrize("kind", ["working", "dynamic"])
def test_deepseek_mla_is_not_packed_and_forward_rows_still_serves_every_row(tiny_deepseek, kind) -> None:
    """MLA keys and values differ in width (the working caches' buffers grow with both)."""
    model = tiny_deepseek.model
    runner = ModelRunner(model)
    assert runner.packing is False
    previous = model.config._attn_implementation
    use_packed_attention(model)  # the state the runner probes in: the packed attention registered
    try:
        with torch.inference_mode():
            assert not supports_packing(model, runner.new_cache)
    finally:
        model.set_attn_implementation(previous)
    tokens = row_tokens(runner.config.vocab_size, seed=5)
    with torch.inference_mode():
        want, want_caches = separate(runner, kind, tokens)
        caches = cached_rows(runner, kind, tokens)
        got = runner.forward_rows([Segment(c, new, all_logits=r.all_logits)
                                   for r, (_, new), c in zip(ROWS, tokens, caches)])
    assert_rows_equal(got, want)
    assert_caches_equal(caches, want_caches)


def test_a_runner_told_not_to_pack_gives_the_packed_results(tiny_qwen) -> None:
    packing, per_row = ModelRunner(tiny_qwen.model), ModelRunner(tiny_qwen.model, packing=False)
    tokens = row_tokens(tiny_qwen.model.config.vocab_size, seed=6)
    with torch.inference_mode():
        results = []
        for runner in (packing, per_row):
            caches = cached_rows(runner, "working", tokens)
            results.append(runner.forward_rows([Segment(c, new, all_logits=r.all_logits)
                                                for r, (_, new), c in zip(ROWS, tokens, caches)]))
    assert packing.packing and not per_row.packing
    assert_rows_equal(*results)
