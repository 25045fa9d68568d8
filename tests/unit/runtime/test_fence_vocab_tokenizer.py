"""The fence's llguidance tokenizer, built from token bytes (fence_vocab._ll_tokenizer), is the one llguidance
builds from the tokenizer's JSON: same bytes and special tokens for every id, same tokenization. A tokenizer
that splits fragments otherwise (SentencePiece's prepended "▁") keeps the JSON-built one."""

from __future__ import annotations

import llguidance
import pytest

from tests.support.tiny_models import tiny_llama_tokenizer, tiny_qwen_dir, tiny_qwen_tokenizer
from zllm.prompt.tokenizer_files import TokenizerFiles
from zllm.runtime.fence_vocab import MASK_SLICES, _ll_tokenizer, _TokenBytes, _tokenizer_json

TEXTS = ("hello world", "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.py\"}}\n</tool_call>",
         "  déjà vu 日本語 🙂\n\n\t  x", "<|im_start|>user\nHi<|im_end|>", "def f(x):\n    return x**2  # ok",
         "</s><s> [INST] byte \x00\x7f")


@pytest.fixture(scope="module", params=["qwen_transformers", "qwen_tokenizer_files", "llama_sentencepiece"])
def tokenizers_pair(request):
    tokenizer = {"qwen_transformers": tiny_qwen_tokenizer, "llama_sentencepiece": tiny_llama_tokenizer,
                 "qwen_tokenizer_files": lambda: TokenizerFiles.from_dir(tiny_qwen_dir())}[request.param]()
    n_vocab = max(tokenizer.get_vocab().values()) + 1
    eos = tokenizer.eos_token_id
    from_json = llguidance.LLTokenizer(_tokenizer_json(tokenizer), n_vocab=n_vocab, eos_token=eos)
    return from_json, _ll_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=eos), n_vocab, tokenizer


@pytest.mark.parametrize(("make", "calls_back"), [(tiny_qwen_tokenizer, True), (tiny_llama_tokenizer, False)])
def test_byte_level_tokenizers_are_called_back_sentencepiece_ones_kept_from_json(make, calls_back) -> None:
    tokenizer = make()
    n_vocab = max(tokenizer.get_vocab().values()) + 1
    from_json = llguidance.LLTokenizer(_tokenizer_json(tokenizer), n_vocab=n_vocab, eos_token=tokenizer.eos_token_id)
    assert _TokenBytes(tokenizer, [], []).splits_like(from_json) is calls_back


def test_every_token_has_the_same_bytes_and_specialness(tokenizers_pair) -> None:
    from_json, from_bytes, n_vocab, _ = tokenizers_pair
    assert (from_bytes.vocab_size, from_bytes.eos_tokens) == (from_json.vocab_size, from_json.eos_tokens)
    assert [from_bytes.decode_bytes([i]) for i in range(n_vocab)] == [from_json.decode_bytes([i]) for i in
                                                                        range(n_vocab)]
    special = [i for i in range(n_vocab) if from_json.is_special_token(i)]
    assert special, "the suite's tokenizers all have special tokens"
    assert [i for i in range(n_vocab) if from_bytes.is_special_token(i)] == special


@pytest.mark.parametrize("text", TEXTS)
def test_text_tokenizes_the_same(tokenizers_pair, text) -> None:
    from_json, from_bytes, _, tokenizer = tokenizers_pair
    assert from_bytes.tokenize_str(text) == from_json.tokenize_str(text)
    if _TokenBytes(tokenizer, [], []).splits_like(from_json):
        # special tokens parsed: the model's own tokenization (llguidance's JSON tokenizer splits the text
        # after every `<...>`, special or not: "a<s>b" is a‧<s‧>‧b there, a‧<s‧>b for the model)
        assert from_bytes.tokenize_str(text, parse_special=True) == tokenizer.encode(text, add_special_tokens=False)
    assert from_bytes.tokenize_bytes(text.encode()[:-1]) == from_json.tokenize_bytes(text.encode()[:-1])
    assert from_bytes.greedy_tokenize(text) == from_json.greedy_tokenize(text)


def test_the_mask_slice_is_llguidances_own_json_string_slice() -> None:
    """A renamed or reworded slice in a later llguidance would silently cost the mask its speed."""
    assert MASK_SLICES and set(MASK_SLICES) <= set(llguidance.LLTokenizer.json_slices())
