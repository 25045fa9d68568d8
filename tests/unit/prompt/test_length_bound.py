"""The length bound is a proof: never more tokens claimed than the real tokenizer makes, and no bound at all
for a tokenizer whose path could fold a long text into few tokens."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from zllm.canonical import ChatRequest, Message
from zllm.errors import ContextLengthExceeded
from zllm.prompt import PromptRenderer
from zllm.prompt.length_bound import LengthBound

# what packs the most text into each token, or the fewest tokens into a text: long runs the vocabularies
# have single tokens for, special-token text, combining sequences NFC composes, Hangul jamo, emoji
_PIECES = (" " * 128, "-" * 112, "//" + "-" * 112, "<|im_start|>", "<|endoftext|>", "e\u0301", "\u1100\u1161\u11a8",
           "\u03b1\u0313\u0300\u0345", "😀", "\n\n\n", "the ", "a", "\t" * 40, "▁", "<0x41>", "\u00e9")


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_PIECES) * rng.randint(1, 60) for _ in range(rng.randint(1, 80)))
            for _ in range(count)]


@pytest.mark.parametrize("which", ["qwen_tokenizer", "llama_tokenizer"])
def test_the_bound_never_claims_more_tokens_than_there_are(which: str, request: pytest.FixtureRequest) -> None:
    tokenizer = request.getfixturevalue(which)
    bound = LengthBound.of(tokenizer)
    assert bound is not None
    for text in _texts(seed=1, count=200):
        assert bound.min_tokens(len(text)) <= len(tokenizer.encode(text, add_special_tokens=False)), text[:80]


def test_qwen_bound_reads_the_longest_piece_and_allows_for_nfc(qwen_tokenizer) -> None:
    assert LengthBound.of(qwen_tokenizer) == LengthBound(longest_token_chars=128, shrink=4)


def test_sentencepiece_style_normalization_removes_nothing(llama_tokenizer) -> None:
    assert LengthBound.of(llama_tokenizer).shrink == 1


def _fast(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def _bpe(**options) -> Tokenizer:
    return Tokenizer(models.BPE(vocab={"[UNK]": 0, "a": 1, "b": 2}, merges=[], unk_token="[UNK]", **options))


def test_no_bound_where_one_token_may_stand_for_any_length() -> None:
    wordpiece = Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    fused_unknowns = _bpe(fuse_unk=True)
    stripped = _bpe()
    stripped.normalizer = normalizers.Strip()
    split_away = _bpe()
    split_away.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    shortening = _bpe()
    shortening.normalizer = normalizers.Replace("  ", " ")
    for backend in (wordpiece, fused_unknowns, stripped, split_away, shortening):
        assert LengthBound.of(_fast(backend)) is None
    assert "[UNK]" == _fast(fused_unknowns).convert_ids_to_tokens(_fast(fused_unknowns).encode("zzzzzz"))[0]


def test_one_unknown_per_character_keeps_the_bound() -> None:
    assert LengthBound.of(_fast(_bpe(fuse_unk=False))) == LengthBound(longest_token_chars=5)


def _request(content: str) -> ChatRequest:
    return ChatRequest(id="r", model="m", messages=(Message(role="user", content=content),))


def test_a_hopeless_prompt_is_refused_before_it_is_tokenized(qwen_tokenizer, monkeypatch) -> None:
    renderer = PromptRenderer(qwen_tokenizer)
    window = 256
    content = "word " * (window * 128 * 4 // 5 + 1)
    monkeypatch.setattr(qwen_tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized a hopeless prompt"))
    with pytest.raises(ContextLengthExceeded, match="prompt is too long: at least 2\\d\\d tokens > 256 maximum"):
        renderer.render(_request(content), window=window)


def test_a_prompt_the_bound_cannot_rule_out_is_tokenized_and_counted(qwen_tokenizer) -> None:
    renderer = PromptRenderer(qwen_tokenizer)
    rendered = renderer.render(_request("word " * 1000), window=256)  # 5,000 characters, ~1,000 tokens
    assert len(rendered.token_ids) > 256  # the caller refuses it with the exact count, as before
