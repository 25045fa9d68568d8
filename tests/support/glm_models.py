"""A GLM-4.5 stand-in: the Qwen byte-level BPE with GLM-4.5's added tokens, and a tiny random GLM model.

No GLM tokenizer is available offline (design/MODELS.md), so the stand-in reuses the Qwen2 BPE from
tests/support/tiny_models.py (same regex and merges family) with Qwen's own added tokens removed and GLM's
appended from id 151643:

    151643 <|endoftext|>  151644 [gMASK]  151645 <sop>  151646 <|system|>  151647 <|user|>
    151648 <|assistant|>  151649 <|observation|>  151650 <think> ... 151659 </tool_response>

Ids differ from real GLM-4.5 (151329...). As in GLM's tokenizer_config, the framing tokens are special
(skipped by `skip_special_tokens=True`) while the reasoning / tool / argument tags are not: they decode as
text, so the dialect parser sees them. There is NO chat template: `zllm.dialects.glm.dialect` writes GLM's
framing itself, so nothing may depend on a template.

- `glm_tokenizer()`: the tokenizer (lru-cached; deep-copy to modify).
- `tiny_glm_dir()`: a 2-layer `Glm4MoeForCausalLM` (hidden 64, 4 routed experts) over it, built once under
  `artifact_cache_dir()` like the other tiny models; EOS ids [<|endoftext|>, <|user|>, <|observation|>] as
  GLM-4.5 ships them. Special and padding ids are never chosen by the random weights (see tiny_models).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tests.support.tiny_models import (
    INIT_RANGE,
    QWEN_FIRST_ADDED_ID,
    SEED,
    _cached,
    _never_emit,
    _set_tokenizer_class,
    build_qwen_backend_tokenizer,
)

GLM_RECIPE_VERSION = 2
# GLM-4.5's added tokens used by its chat format, in GLM's own relative order; `special` as GLM marks them
GLM_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("[gMASK]", True),
    ("<sop>", True),
    ("<|system|>", True),
    ("<|user|>", True),
    ("<|assistant|>", True),
    ("<|observation|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<arg_key>", False),
    ("</arg_key>", False),
    ("<arg_value>", False),
    ("</arg_value>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
)
GLM_FIRST_ADDED_ID = QWEN_FIRST_ADDED_ID  # the BPE's own vocabulary ends at 151642
GLM_VOCAB_SIZE = 151680  # embedding rows: the 151660 tokens padded to a multiple of 64
GLM_EOS_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")


def glm_token_id(text: str) -> int:
    """The stand-in id of one of GLM_ADDED_TOKENS."""
    names = [name for name, _ in GLM_ADDED_TOKENS]
    return GLM_FIRST_ADDED_ID + names.index(text)


def glm_eos_ids() -> list[int]:
    return [glm_token_id(name) for name in GLM_EOS_TOKENS]


def build_glm_backend_tokenizer():
    """The Qwen2 BPE without Qwen's added tokens, plus GLM's (a `tokenizers.Tokenizer`)."""
    from tokenizers import AddedToken, Tokenizer

    spec = json.loads(build_qwen_backend_tokenizer().to_str())
    spec["added_tokens"] = []  # Qwen's <|im_start|> etc.; they are not in the BPE vocabulary itself
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.add_tokens([AddedToken(text, special=special, normalized=False) for text, special in GLM_ADDED_TOKENS])
    first = tokenizer.token_to_id(GLM_ADDED_TOKENS[0][0])
    if first != GLM_FIRST_ADDED_ID:
        raise RuntimeError(f"<|endoftext|> got id {first}, expected {GLM_FIRST_ADDED_ID}")
    return tokenizer


def build_glm_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=build_glm_backend_tokenizer(),
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )


@functools.cache
def glm_tokenizer():
    """The stand-in tokenizer, loaded once per process from the tiny model's directory."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_glm_dir())


def tiny_glm_dir() -> Path:
    return _cached(f"tiny-glm45-v{GLM_RECIPE_VERSION}", _build_tiny_glm)


def _build_tiny_glm(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Glm4MoeConfig, Glm4MoeForCausalLM

    tokenizer = build_glm_tokenizer()
    ids = tokenizer.encode("Hello world!<tool_call>", add_special_tokens=False)
    if ids != [9707, 1879, 0, glm_token_id("<tool_call>")]:
        raise RuntimeError(f"GLM stand-in tokenizer is wrong: 'Hello world!<tool_call>' -> {ids}")
    eos = glm_eos_ids()
    pad = glm_token_id("<|endoftext|>")
    config = Glm4MoeConfig(
        vocab_size=GLM_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=1,  # layer 0 dense, layer 1 MoE: both paths exercised
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        num_nextn_predict_layers=0,
        tie_word_embeddings=True,  # halves the ~39 MB embedding matrix on disk
        initializer_range=INIT_RANGE,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    torch.manual_seed(SEED)
    model = Glm4MoeForCausalLM(config).eval()
    _never_emit(model.get_output_embeddings(), range(GLM_FIRST_ADDED_ID, GLM_VOCAB_SIZE))
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _set_tokenizer_class(out, "PreTrainedTokenizerFast")

