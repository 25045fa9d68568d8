"""The test tokenizers are the real thing: the converted Qwen BPE agrees with tiktoken on the same ranks."""

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from tests.support.tiny_models import QWEN_ADDED_TOKENS, QWEN_PRETOKENIZE_REGEX, qwen_tiktoken_path

MIXED_TEXT = (
    "def f(x):\n    return x ** 2  # square\n\n"
    "Héllo wörld! 日本語のテキスト, 中文. Emoji: 🎉👍🏽 — “quotes” … 12345 tabs\t\tand  spaces   \n\n\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}"
)


def test_hello_world(qwen_tokenizer) -> None:
    assert qwen_tokenizer.encode("Hello world!", add_special_tokens=False) == [9707, 1879, 0]


def test_agrees_with_tiktoken(qwen_tokenizer) -> None:
    ranks = load_tiktoken_bpe(str(qwen_tiktoken_path()))
    reference = tiktoken.Encoding("qwen", pat_str=QWEN_PRETOKENIZE_REGEX, mergeable_ranks=ranks, special_tokens={})
    assert qwen_tokenizer.encode(MIXED_TEXT, add_special_tokens=False) == reference.encode(MIXED_TEXT)


def test_added_tokens_have_their_real_ids(qwen_tokenizer) -> None:
    for offset, (text, _) in enumerate(QWEN_ADDED_TOKENS):
        assert qwen_tokenizer.convert_tokens_to_ids(text) == 151643 + offset
    assert qwen_tokenizer.encode("<tool_call></tool_call><think></think>", add_special_tokens=False) == [
        151657, 151658, 151667, 151668]


def test_tool_and_think_tags_survive_skip_special_tokens(qwen_tokenizer) -> None:
    ids = qwen_tokenizer.encode("<|im_start|><think>x</think><tool_call>", add_special_tokens=False)
    assert qwen_tokenizer.decode(ids, skip_special_tokens=True) == "<think>x</think><tool_call>"


def test_llama_tokenizer_is_sentencepiece_style(llama_tokenizer) -> None:
    ids = llama_tokenizer.encode("Hello 🎉")
    assert ids[0] == llama_tokenizer.bos_token_id
    pieces = llama_tokenizer.convert_ids_to_tokens(ids)
    assert pieces[1].startswith("▁") and "<0xF0>" in pieces  # ▁ for spaces, byte fallback for the emoji
    assert llama_tokenizer.decode(ids, skip_special_tokens=True) == "Hello 🎉"
