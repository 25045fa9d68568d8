"""Picking one GGUF out of a repo by quantization tag or file name (gguf_pick.py): pure name logic."""

from __future__ import annotations

import pytest

from zllm.errors import PullError
from zllm.models.sources.gguf_pick import pick_gguf, quant_of

REPO = [
    "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
    "Qwen2.5-7B-Instruct.Q8_0.gguf",
    "Qwen2.5-7B-Instruct-IQ4_XS.gguf",
    "Qwen2.5-7B-Instruct-Q4_K_S.gguf",
    "BF16/Qwen2.5-7B-Instruct-BF16-00001-of-00002.gguf",
    "BF16/Qwen2.5-7B-Instruct-BF16-00002-of-00002.gguf",
    "mmproj-Qwen2.5-7B-f16.gguf",
    "README.md",
]


@pytest.mark.parametrize(
    "name, quant",
    [("a-Q4_K_M.gguf", "Q4_K_M"), ("a.q8_0.gguf", "Q8_0"), ("a-UD-Q4_K_XL-00001-of-00003.gguf", "UD-Q4_K_XL"),
     ("a-bf16.gguf", "BF16"), ("a-IQ4_XS.gguf", "IQ4_XS"), ("plain.gguf", None)],
)  # fmt: skip
def test_quant_of(name, quant):
    assert quant_of(name) == quant


@pytest.mark.parametrize(
    "quant, picked",
    [("Q4_K_M", "Qwen2.5-7B-Instruct-Q4_K_M.gguf"), ("q8_0", "Qwen2.5-7B-Instruct.Q8_0.gguf"),
     ("iq4_xs", "Qwen2.5-7B-Instruct-IQ4_XS.gguf")],
)  # fmt: skip
def test_a_tag_picks_its_file(quant, picked):
    assert pick_gguf(REPO, "org/repo", quant=quant) == picked


def test_a_tag_is_not_a_prefix_match():
    with pytest.raises(PullError, match="no Q4_K GGUF"):
        pick_gguf(REPO, "org/repo", quant="Q4_K")


def test_ambiguous_tags_ask_for_file():
    with pytest.raises(PullError, match="2 GGUF files in org/repo match Q4_K_M") as caught:
        pick_gguf(["a-Q4_K_M.gguf", "b-Q4_K_M.gguf"], "org/repo", quant="Q4_K_M")
    assert caught.value.hint == "name one with --file: a-Q4_K_M.gguf, b-Q4_K_M.gguf"


def test_split_files_are_refused():
    with pytest.raises(PullError, match="split GGUF; split GGUFs are not supported yet"):
        pick_gguf(REPO, "org/repo", quant="BF16")


def test_file_and_the_only_file():
    assert pick_gguf(REPO, "org/repo", file="Qwen2.5-7B-Instruct.Q8_0.gguf") == "Qwen2.5-7B-Instruct.Q8_0.gguf"
    assert pick_gguf(["only.gguf", "mmproj-x.gguf"], "org/repo") == "only.gguf"  # projectors are not models
    with pytest.raises(PullError, match="has no GGUF file `nope.gguf`") as caught:
        pick_gguf(REPO, "org/repo", file="nope.gguf")
    assert "Qwen2.5-7B-Instruct-Q4_K_M.gguf" in caught.value.hint
    with pytest.raises(PullError, match="holds no GGUF files"):
        pick_gguf(["README.md"], "org/repo")
