"""The length bound is a proof: never more tokens claimed than the real tokenizer makes, and no bound at all
for a tokenizer whose path could fold a long text into few tokens."""

from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests.support.deepseek_models import v31_tokenizer_dir
from tests.support.tiny_models import tiny_qwen_dir

from zllm.canonical import ChatRequest, Message
from zllm.errors import ContextLengthExceeded
from zllm.prompt import PromptRenderer
from zllm.prompt.length_bound import LengthBound, _byte_level_alphabet
from zllm.prompt.tokenizer_files import TokenizerFiles

# what packs the most text into each token, or the fewest tokens into a text: long runs the vocabularies
# have single tokens for, special-token text, combining sequences NFC composes, Hangul jamo, emoji
_PIECES = (" " * 128, "-" * 112, "//" + "-" * 112, "<|im_start|>", "<|endoftext|>", "e\u0301", "\u1100\u1161\u11a8",
           "\u03b1\u0313\u0300\u0345", "😀", "\n\n\n", "the ", "a", "\t" * 40, "▁", "<0x41>", "\u00e9",
           "\x04", "\x13\x14", "\x7f", "\U00040000", "\U000fffff")


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_PIECES) * rng.randint(1, 60) for _ in range(rng.randint(1, 80)))
            for _ in range(count)]


# every kind of tokenizer object zllm renders with: transformers' fast tokenizers (torch path) and
# TokenizerFiles (llama.cpp path, the tokenizer.json a GGUF's vocabulary was written to at pull)
TOKENIZERS = {
    "qwen_tokenizer": lambda request: request.getfixturevalue("qwen_tokenizer"),
    "llama_tokenizer": lambda request: request.getfixturevalue("llama_tokenizer"),
    "qwen_tokenizer_files": lambda request: TokenizerFiles.from_dir(tiny_qwen_dir()),
    "deepseek_tokenizer_files": lambda request: TokenizerFiles.from_dir(v31_tokenizer_dir()),
    "byte_level_missing_bytes": lambda request: _fast(_byte_level_lacking(b"\x04\x13\x14\x7f\xf1\xf5\xff")),
    "default_gguf": lambda request: TokenizerFiles.from_dir(_default_model_dir()),
}


def _default_model_dir():
    from tests.support.default_gguf import NAME, default_model_data_dir

    return default_model_data_dir() / "models" / NAME


@pytest.mark.parametrize("which", [pytest.param(name, marks=[pytest.mark.e2e, pytest.mark.timeout(900)])
                                   if name == "default_gguf" else name for name in TOKENIZERS])
def test_the_bound_never_claims_more_tokens_than_there_are(which: str, request: pytest.FixtureRequest) -> None:
    tokenizer = TOKENIZERS[which](request)
    bound = LengthBound.of(tokenizer)
    assert bound is not None
    for text in _texts(seed=1, count=200):
        assert bound.min_tokens(text) <= len(tokenizer.encode(text, add_special_tokens=False)), text[:80]


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


def test_no_bound_where_unknown_characters_vanish() -> None:
    # no <unk>, no byte fallback: a BPE model drops every character it has no piece for
    silent = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    assert silent.encode("azzzzzzzzb").ids == [0, 1]
    assert LengthBound.of(silent) is None
    # byte-level, but lacking a continuation byte: a multi-byte character may lose all of its bytes
    assert LengthBound.of(_byte_level_lacking(b"\x80")) is None
    # the bound then counts out the ASCII characters the byte-level vocabulary lacks, and only beside no normalizer
    lacking = _byte_level_lacking(b"\x04\x13")
    assert LengthBound.of(lacking).dropped == frozenset("\x04\x13")
    assert lacking.encode("\x04" * 1000).ids == []
    assert LengthBound.of(lacking).min_tokens("\x04" * 1000 + "\x13 ab") == 1
    lacking.normalizer = normalizers.NFC()
    assert LengthBound.of(lacking) is None


def test_a_truncating_tokenizer_gets_no_bound() -> None:
    truncating = _bpe(fuse_unk=False)
    truncating.enable_truncation(8)
    assert LengthBound.of(truncating) is None


def test_an_added_token_that_strips_whitespace_takes_the_bound_away() -> None:
    stripping = _byte_level_lacking(b"")
    assert LengthBound.of(stripping) is not None
    stripping.add_special_tokens([AddedToken("<X>", lstrip=True, rstrip=True)])
    assert len(stripping.encode(" " * 500 + "<X>" + " " * 500).ids) == 1  # 1,003 characters, one token
    assert LengthBound.of(stripping) is None


def test_the_llama_cpp_path_reads_the_same_bound_as_transformers(qwen_tokenizer) -> None:
    assert LengthBound.of(TokenizerFiles.from_dir(tiny_qwen_dir())) == LengthBound.of(qwen_tokenizer)


@pytest.mark.e2e
@pytest.mark.timeout(900)  # the first run fetches the default GGUF
def test_the_default_gguf_tokenizer_gets_a_bound_that_counts_out_what_it_drops() -> None:
    tokenizer = TokenizerFiles.from_dir(_default_model_dir())
    bound = LengthBound.of(tokenizer)
    assert bound is not None and bound.shrink == 1
    # its vocabulary (written from the GGUF) lacks six ASCII control characters: they encode to nothing
    assert bound.dropped and all(tokenizer.encode(c * 50, add_special_tokens=False) == [] for c in bound.dropped)
    assert bound.min_tokens("".join(bound.dropped) * 100_000) == 0


def _byte_level_lacking(missing: bytes) -> Tokenizer:
    """A byte-level BPE over the whole byte alphabet but `missing`, plus a long piece, with no <unk>: what
    the default GGUF's vocabulary looks like (it lacks six ASCII control characters and bytes UTF-8 never
    uses)."""
    alphabet = [piece for byte, piece in enumerate(_byte_level_alphabet()) if byte not in missing]
    vocab = {piece: i for i, piece in enumerate([*alphabet, "ĠĠ", "ĠĠĠĠ"])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "Ġ"), ("ĠĠ", "ĠĠ")], fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tokenizer


def _request(content: str) -> ChatRequest:
    return ChatRequest(id="r", model="m", messages=(Message(role="user", content=content),))


@pytest.mark.parametrize("which", ["qwen_tokenizer", "qwen_tokenizer_files"])
def test_a_hopeless_prompt_is_refused_before_it_is_tokenized(which: str, request: pytest.FixtureRequest,
                                                             monkeypatch) -> None:
    tokenizer = TOKENIZERS[which](request)
    renderer = PromptRenderer(tokenizer)
    window = 256
    content = "word " * (window * 128 * 4 // 5 + 1)
    monkeypatch.setattr(tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized a hopeless prompt"))
    with pytest.raises(ContextLengthExceeded, match="prompt is too long: at least 2\\d\\d tokens > 256 maximum"):
        renderer.render(_request(content), window=window)


def test_a_prompt_the_bound_cannot_rule_out_is_tokenized_and_counted(qwen_tokenizer) -> None:
    renderer = PromptRenderer(qwen_tokenizer)
    rendered = renderer.render(_request("word " * 1000), window=256)  # 5,000 characters, ~1,000 tokens
    assert len(rendered.token_ids) > 256  # the caller refuses it with the exact count, as before


def test_counting_out_dropped_characters_stops_once_the_bound_is_enough() -> None:
    bound = LengthBound.of(_byte_level_lacking(b"\x04"))
    assert bound.longest_token_chars == 4
    text = "\x04" * 200_000 + "a" * 100_000  # the counted characters come after a long dropped run
    assert bound.min_tokens(text) == 25_000
    assert 10 <= bound.min_tokens(text, enough=10) <= 25_000
    assert bound.min_tokens(text, enough=10**9) == 25_000
    assert bound.min_tokens("\x04" * 300_000, enough=10) == 0
