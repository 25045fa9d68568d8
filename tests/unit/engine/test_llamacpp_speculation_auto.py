"""`--speculative auto` (the default): on where verifying a draft is exact and costs nothing on a turn with
nothing to copy, off elsewhere (engines.choose_speculation), with real tiny GGUFs.

F32/F16 weights take another matmul kernel for 1 row than for 2+: exact drafts would need a pad row in every lone
step, so auto serves them unpadded and without speculation, while an explicit `on` still pads. Q4_1 weights take
vec_dot at every row count: auto speculates there with no pad row. The load-time measures are kept in the state
dir, so a second load reads them instead of measuring (engine/llamacpp/load_measures.py)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

lc = pytest.importorskip("llama_cpp")

from tests.support.backends import tiny_gguf_model_dir  # noqa: E402
from zllm.config import Settings  # noqa: E402
from zllm.engine.contract import UNBOUNDED_ROWS  # noqa: E402
from zllm.engines import MEASURES_FILE, choose_speculation, local_client  # noqa: E402


@pytest.fixture(scope="module")
def q4_1_dir(tmp_path_factory):
    """The tiny llama-bpe model directory with its weights quantized to Q4_1."""
    source = tiny_gguf_model_dir("llama-bpe")
    target = tmp_path_factory.mktemp("q4_1-dir")
    for path in source.iterdir():
        if path.is_file() and path.name != "model.gguf":
            shutil.copy2(path, target / path.name)
    params = lc.llama_model_quantize_default_params()
    params.ftype, params.nthread = lc.LLAMA_FTYPE_MOSTLY_Q4_1, 1
    assert lc.llama_model_quantize(str(source / "model.gguf").encode(), str(target / "model.gguf").encode(),
                                   params) == 0
    return target


def serve(model_dir, tmp_path, **settings):
    return local_client(model_dir, Settings(backend="llamacpp", threads=1, data_dir=tmp_path, state_dir=tmp_path,
                                            context_length=512, **settings), name="tiny", created=1)


def test_auto_serves_f32_weights_unpadded_without_speculation(tmp_path) -> None:
    client = serve(tiny_gguf_model_dir("llama-bpe"), tmp_path)
    try:
        engine = client.loaded.engine
        assert client.speculation is None
        assert engine.needs_pad and not engine.settings.uniform_rows  # measured, then dropped
        assert engine.step_rows == 1 and engine.verify_rows == UNBOUNDED_ROWS and engine.verify_row_cost is None
        assert engine.free_sequences == engine.settings.max_sequences  # the pad's sequence id serves requests
        choice = choose_speculation(Settings(), client.loaded)
        assert not choice.on and "pad row" in choice.why and "--speculative on" in choice.why
    finally:
        client.close()


def test_explicit_on_still_pads_f32_weights(tmp_path) -> None:
    client = serve(tiny_gguf_model_dir("llama-bpe"), tmp_path, speculative="on")
    try:
        engine = client.loaded.engine
        assert client.speculation is not None
        assert engine.settings.uniform_rows and engine.step_rows == 2 and engine.verify_rows == 63
        assert str(choose_speculation(Settings(speculative="on"), client.loaded)).startswith("on (--speculative on;")
    finally:
        client.close()


def test_off_measures_nothing(tmp_path) -> None:
    client = serve(tiny_gguf_model_dir("llama-bpe"), tmp_path, speculative="off")
    try:
        assert client.speculation is None and client.loaded.engine.needs_pad is None
        assert not (tmp_path / MEASURES_FILE).exists()
    finally:
        client.close()


def test_auto_speculates_on_q4_1_weights_with_no_pad_and_keeps_the_measures(q4_1_dir, tmp_path) -> None:
    client = serve(q4_1_dir, tmp_path)
    try:
        engine = client.loaded.engine
        assert client.speculation is not None
        assert engine.needs_pad == "" and engine.step_rows == 1 and engine.verify_rows >= 2
        assert engine.verify_row_cost is not None
        assert choose_speculation(Settings(), client.loaded).on
    finally:
        client.close()
    kept = json.loads((tmp_path / MEASURES_FILE).read_text())
    (entry,) = kept.values()
    assert entry["agreeing_rows"] == engine.verify_rows
    # a second load reads the file instead of measuring: a doctored entry shows it
    entry.update(agreeing_rows=3, verify_row_cost=0.5)
    (tmp_path / MEASURES_FILE).write_text(json.dumps(kept))
    again = serve(q4_1_dir, tmp_path)
    try:
        assert again.loaded.engine.verify_rows == 3 and again.loaded.engine.verify_row_cost == 0.5
    finally:
        again.close()
    # another file at that path (a new modification time) is measured again
    stat = (q4_1_dir / "model.gguf").stat()
    os.utime(q4_1_dir / "model.gguf", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    changed = serve(q4_1_dir, tmp_path)
    try:
        assert changed.loaded.engine.verify_rows == engine.verify_rows
    finally:
        changed.close()
    assert len(json.loads((tmp_path / MEASURES_FILE).read_text())) == 2


def test_auto_is_off_on_torch_and_explicit_on_is_not(tmp_path) -> None:
    from tests.support.tiny_models import tiny_llama_dir

    for mode, on in (("auto", False), ("on", True)):
        client = local_client(tiny_llama_dir(), Settings(device="cpu", threads=1, context_length=64, data_dir=tmp_path,
                                                         state_dir=tmp_path, speculative=mode), name="t", created=1)
        try:
            assert (client.speculation is not None) is on
            assert "torch" in choose_speculation(Settings(), client.loaded).why
        finally:
            client.close()


def test_auto_is_silently_off_on_vllm_and_explicit_on_is_refused(tmp_path) -> None:
    """vLLM speculates with its own --speculative-config: auto passes the check (the next one, no safetensors
    weights, answers here), on is a ConfigError naming vLLM's own flag."""
    import asyncio
    from types import SimpleNamespace

    from zllm.engines import open_engine
    from zllm.errors import ConfigError

    served = SimpleNamespace(name="tiny", path=tiny_gguf_model_dir("llama-bpe"), created=1)
    for mode, message in (("auto", "no safetensors weights"), ("on", "--speculative and --draft-model")):
        with pytest.raises(ConfigError, match=message):
            asyncio.run(open_engine(Settings(backend="vllm", vllm_python="/nonexistent/python", speculative=mode,
                                             state_dir=tmp_path), served))


def test_auto_is_off_at_two_threads_over_f16_cells_even_for_q4_1(q4_1_dir, tmp_path) -> None:
    """One query row over F16 cells takes the KV-split attention, split by thread: at 2+ threads a lone step's
    bits differ from a verify's whatever the weights, so auto does not speculate there (and says how to)."""
    client = local_client(q4_1_dir, Settings(backend="llamacpp", threads=2, data_dir=tmp_path, state_dir=tmp_path,
                                             context_length=512), name="tiny", created=1)
    try:
        engine = client.loaded.engine
        assert client.speculation is None and not engine.settings.uniform_rows and engine.step_rows == 1
        why = choose_speculation(Settings(), client.loaded).why
        assert "KV-split" in why and "--cache-type q8_0" in why
    finally:
        client.close()
