"""Incremental detokenizer: streamed pieces concatenate to the full decode, without partial characters."""

import random

import pytest

from tests.support.tiny_models import tiny_llama_tokenizer, tiny_qwen_tokenizer
from zllm.runtime.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, raw_decoder

TEXTS = [
    "Hello world! def f(x):\n    return x ** 2\n",
    "日本語のテキスト。中文文本。 Emoji: 🎉👍🏽🇫🇷 — “quotes” … naïve café",
    "  leading spaces,\ttabs\tand trailing   ",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀 ﷽ and 🧑‍🧑‍🧒‍🧒 zero-width joiners",
]


@pytest.fixture(scope="module", params=["qwen", "llama"])
def tokenizer(request):
    return tiny_qwen_tokenizer() if request.param == "qwen" else tiny_llama_tokenizer()


def stream(tokenizer, ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(token_id) for token_id in ids]
    return [*pieces, detok.flush()]


def reference(tokenizer, ids: list[int]) -> str:
    return raw_decoder(tokenizer)(ids)


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_concatenate_to_the_full_decode(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == reference(tokenizer, ids) == text
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


def test_multibyte_characters_really_are_split_across_tokens(tokenizer) -> None:
    """Guard: the texts above exercise the hard case (a character's bytes spread over several tokens)."""
    ids = tokenizer.encode(TEXTS[1], add_special_tokens=False)
    assert any(REPLACEMENT_CHAR in reference(tokenizer, [token_id]) for token_id in ids)


def test_random_token_sequences(tokenizer) -> None:
    rng = random.Random(0)
    pool = range(tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=False))
    if _has_byte_fallback(tokenizer):
        # SentencePiece's ByteFallback turns an *invalid* run of <0xNN> tokens into one U+FFFD per byte, ASCII
        # bytes of the run included, so random byte tokens (garbage) decode differently depending on where a
        # window starts (see detokenizer.py). Valid byte-fallback text is covered by the real-text tests.
        pool = [i for i in pool if not tokenizer.convert_ids_to_tokens(i).startswith("<0x")]
    for _ in range(300):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 30))]
        pieces = stream(tokenizer, ids)
        full = reference(tokenizer, ids)
        assert "".join(pieces) == full
        # a U+FFFD may only appear where the full decode has one too (invalid bytes), never from a split
        assert sum(piece.count(REPLACEMENT_CHAR) for piece in pieces) == full.count(REPLACEMENT_CHAR)


def test_random_splices_of_real_text(tokenizer) -> None:
    """Token sequences cut out of real text at random points: starts and ends mid-character."""
    rng = random.Random(1)
    ids = tokenizer.encode("".join(TEXTS), add_special_tokens=False)
    cut_points = range(len(ids) + 1)
    if _has_byte_fallback(tokenizer):
        # cut only between whole characters: a byte run cut mid-character is garbage, which ByteFallback
        # decodes context-dependently (see test_random_token_sequences)
        cut_points = [i for i in cut_points if _is_character_boundary(tokenizer, ids, i)]
    for _ in range(150):
        start, end = sorted(rng.sample(list(cut_points), 2))
        chunk = ids[start:end]
        pieces = stream(tokenizer, chunk)
        full = reference(tokenizer, chunk)
        assert "".join(pieces) == full
        assert not any(REPLACEMENT_CHAR in piece for piece in pieces[:-1]) or REPLACEMENT_CHAR in full


def _has_byte_fallback(tokenizer) -> bool:
    return tokenizer.convert_tokens_to_ids("<0x41>") != tokenizer.unk_token_id


def _is_character_boundary(tokenizer, ids: list[int], i: int) -> bool:
    """No byte token on both sides of position i (so no character's bytes straddle it)."""
    def is_byte(j: int) -> bool:
        return 0 <= j < len(ids) and tokenizer.convert_ids_to_tokens(ids[j]).startswith("<0x")
    return not (is_byte(i - 1) and is_byte(i))


def test_incomplete_character_at_the_end_is_flushed_as_the_full_decode_has_it() -> None:
    tokenizer = tiny_qwen_tokenizer()
    ids = tokenizer.encode("ok 🎉", add_special_tokens=False)[:-1]  # drop the emoji's last token
    detok = IncrementalDetokenizer(tokenizer)
    streamed = "".join(detok.push(t) for t in ids)
    assert REPLACEMENT_CHAR not in streamed
    assert streamed + detok.flush() == reference(tokenizer, ids)
    assert reference(tokenizer, ids).endswith(REPLACEMENT_CHAR)


def test_special_tokens_are_skipped_but_tool_tags_are_text() -> None:
    tokenizer = tiny_qwen_tokenizer()
    ids = tokenizer.encode("a<|im_start|>b<tool_call>c<|endoftext|>", add_special_tokens=False)
    assert "".join(stream(tokenizer, ids)) == "ab<tool_call>c"


def test_sentencepiece_spaces_between_tokens() -> None:
    tokenizer = tiny_llama_tokenizer()
    ids = tokenizer.encode("Hello world and more words", add_special_tokens=False)
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == "Hello world and more words"
    assert any(piece.startswith(" ") for piece in pieces)  # `▁` became a real space mid-stream


def test_decode_window_stays_small_on_long_outputs() -> None:
    """O(1)-ish per token: the decoded window does not grow with the output."""
    tokenizer = tiny_qwen_tokenizer()
    detok = IncrementalDetokenizer(tokenizer)
    windows: list[int] = []
    decode = detok._decode
    detok._decode = lambda ids: windows.append(len(ids)) or decode(ids)
    ids = tokenizer.encode(" ".join(TEXTS) * 20, add_special_tokens=False)
    assert len(ids) > 1000
    "".join(detok.push(t) for t in ids)
    assert max(windows) <= 12
