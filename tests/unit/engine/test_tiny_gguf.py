"""tests/support/tiny_gguf.py: llama.cpp loads the written GGUFs, computes the torch model's logits and
tokenizes a rendered chat prompt exactly as the HF tokenizer does.

Tolerances: F32 max |logit diff| <= 1e-4 x max |logit| (measured ~2e-6: llama.cpp's F32 matmuls with an F32
KV cache); F16 weights <= 2e-2 x max |logit|, with the same greedy token at >= 95% of positions.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import torch  # noqa: E402

from tests.support import tiny_gguf  # noqa: E402
from tests.support.tiny_gguf import write_tiny_gguf  # noqa: E402

GGML_TYPE_F32 = 0
N_CTX = 256
SPECS = ["llama", "qwen3", "llama-bpe", "qwen2", "smollm2"]  # smollm2: skipped when pip cannot fetch it
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _messages(spec: str) -> list[dict]:
    text = "Hello world! 12345 3.14 café naïve 日本語 🦙\n\tdef f(x):\n    return x  # done"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    if spec != "llama":  # ChatML with Hermes tool calls: <tool_call> / <tool_response> are added tokens
        messages += [
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function",
                             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": '{"temp": 21}'},
        ]
    else:
        messages += [{"role": "assistant", "content": "Hi there."}, {"role": "user", "content": "And   now?"}]
    return messages


def _model(spec: str):
    """(torch model, HF tokenizer); skips the test when the SmolLM2 tokenizer cannot be fetched."""
    try:
        return tiny_gguf.tiny_torch_model(spec)
    except tiny_gguf.SmolLM2Unavailable as exc:
        pytest.skip(str(exc))


def _prompt(spec: str) -> str:
    _, tokenizer = _model(spec)
    tools = [WEATHER_TOOL] if spec != "llama" else None
    return tokenizer.apply_chat_template(_messages(spec), tools=tools, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="session")
def llama_for(tiny_gguf_path):
    """Factory: a llama_cpp.Llama over tiny_gguf_path(spec, dtype), one per session; F32 KV cache."""
    loaded: dict = {}

    def get(spec: str, dtype: str = "f32"):
        if (spec, dtype) not in loaded:
            _model(spec)
            loaded[spec, dtype] = llama_cpp.Llama(
                model_path=str(tiny_gguf_path(spec, dtype)), n_ctx=N_CTX, n_batch=N_CTX, n_threads=1,
                logits_all=True, flash_attn=False, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False,
            )
        return loaded[spec, dtype]

    yield get
    for llm in loaded.values():
        llm.close()


def _torch_logits(spec: str, ids: list[int]) -> np.ndarray:
    model, _ = _model(spec)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _llama_cpp_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def _hf_ids(spec: str) -> list[int]:
    _, tokenizer = _model(spec)
    return tokenizer.encode(_prompt(spec), add_special_tokens=False)


@pytest.mark.parametrize("spec", SPECS)
def test_tokenization_of_a_rendered_chat_prompt_matches_hf(spec, llama_for):
    llm = llama_for(spec)
    text = _prompt(spec)
    hf_ids = _hf_ids(spec)
    cpp_ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)  # llama_tokenize, parse_special
    assert cpp_ids == hf_ids
    assert len(hf_ids) > 30


@pytest.mark.parametrize("spec", SPECS)
def test_f32_logits_match_torch(spec, llama_for):
    ids = _hf_ids(spec)
    ref = _torch_logits(spec, ids)
    got = _llama_cpp_logits(llama_for(spec), ids)
    assert got.shape == ref.shape
    scale = float(np.abs(ref).max())
    diff = float(np.abs(got - ref).max())
    assert diff <= 1e-4 * scale, f"max |diff| {diff:.3g} vs logit scale {scale:.3g}"
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("spec", ["llama", "llama-bpe", "qwen3"])
def test_f16_logits_match_torch_loosely(spec, llama_for):
    ids = _hf_ids(spec)
    ref = _torch_logits(spec, ids)
    got = _llama_cpp_logits(llama_for(spec, "f16"), ids)
    scale = float(np.abs(ref).max())
    diff = float(np.abs(got - ref).max())
    assert diff <= 2e-2 * scale, f"max |diff| {diff:.3g} vs logit scale {scale:.3g}"
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.95


def test_low_level_api_decode_matches_torch(tiny_gguf_path):
    """The low-level calls a backend makes: load, context, one batch of the prompt, logits of the last token."""
    spec = "llama-bpe"
    ids = _hf_ids(spec)
    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(tiny_gguf_path(spec)).encode(), model_params)
    assert model
    ctx_params = llama_cpp.llama_context_default_params()
    ctx_params.n_ctx = N_CTX
    ctx_params.n_batch = N_CTX
    ctx_params.n_threads = ctx_params.n_threads_batch = 1
    ctx_params.type_k = ctx_params.type_v = GGML_TYPE_F32
    # the default (AUTO) turns flash attention on, whose CPU kernel rounds through F16: ~6e-4 x logit scale
    ctx_params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = llama_cpp.llama_init_from_model(model, ctx_params)
    assert ctx
    batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
    try:
        for i, token in enumerate(ids):
            batch.token[i] = token
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(ids) - 1
        batch.n_tokens = len(ids)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        vocab = llama_cpp.llama_model_get_vocab(model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        pointer = llama_cpp.llama_get_logits_ith(ctx, -1)
        got = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).copy()
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    ref = _torch_logits(spec, ids)[-1]
    assert float(np.abs(got - ref).max()) <= 1e-4 * float(np.abs(ref).max())


@pytest.mark.parametrize("spec", SPECS)
def test_metadata_special_tokens_and_template(spec, llama_for):
    llm = llama_for(spec)
    model, tokenizer = _model(spec)
    meta = llm.metadata
    assert meta["general.architecture"] == {"llama-bpe": "llama", "smollm2": "llama"}.get(spec, spec)
    assert meta["tokenizer.chat_template"] == tokenizer.chat_template
    assert meta["tokenizer.ggml.model"] == ("llama" if spec == "llama" else "gpt2")
    if spec != "llama":
        assert meta["tokenizer.ggml.pre"] == ("smollm" if spec == "smollm2" else "qwen2")
    assert llm.n_vocab() == model.config.vocab_size
    assert llm.token_eos() == tokenizer.eos_token_id
    # llama.cpp adds BOS exactly when the HF tokenizer does
    ids = tokenizer.encode("Hello world")
    assert llm.tokenize(b"Hello world", add_bos=True, special=True) == ids


@pytest.mark.parametrize("spec", SPECS)
def test_detokenization_matches_hf(spec, llama_for):
    llm = llama_for(spec)
    _, tokenizer = _model(spec)
    ids = _hf_ids(spec)
    assert llm.detokenize(ids, special=True).decode("utf-8") == tokenizer.decode(ids)


def test_without_the_qk_permutation_llama_logits_differ(tmp_path, monkeypatch):
    """The llama-arch q/k permutation matters: skipping it (HF's layout under GGML's RoPE) breaks the logits."""
    spec = "llama"
    model, tokenizer = _model(spec)
    monkeypatch.setattr(tiny_gguf, "permute_for_ggml_rope", lambda weight, n_heads: weight)
    path = write_tiny_gguf(model, tokenizer, tmp_path / "unpermuted.gguf")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_CTX, n_threads=1, logits_all=True,
                          type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False)
    try:
        ids = _hf_ids(spec)
        got = _llama_cpp_logits(llm, ids)
    finally:
        llm.close()
    ref = _torch_logits(spec, ids)
    assert np.abs(got[0] - ref[0]).max() <= 1e-4 * np.abs(ref).max()  # position 0: RoPE is the identity
    assert np.abs(got - ref).max() > 1e-2 * np.abs(ref).max()


def test_permutation_pairs_rotate_half_dims():
    weight = np.arange(8 * 3).reshape(8, 3)  # 2 heads of head_dim 4: HF rows (0,2) (1,3) pair up per head
    permuted = tiny_gguf.permute_for_ggml_rope(weight, 2)
    assert permuted[:, 0].tolist() == [0, 6, 3, 9, 12, 18, 15, 21]
