"""The prefix-reusing encoder gives exactly the tokenizer's ids for growing, branching and odd conversations, and
reuses the shared part of a continuing one (real tokenizers: Qwen byte-level BPE, SentencePiece-style Llama)."""

from __future__ import annotations

import pytest

from zllm.prompt.prefix_encode import PrefixReusingEncoder, common_prefix_length

ODD_CONTENTS = (
    "Hello world!", "  leading and trailing spaces  ", "\n\nnewlines\n\n", "Héllo wörld 日本語 🎉👍🏽 “q” … 12345\t\t",
    "a text that ends in a partial token <|im_st", "def f(x):\n    return x ** 2\n", "", "1\tline\n2\tline\n" * 40,
)


def framing(tokenizer) -> tuple[str, str]:
    """An opening and a closing special token of this tokenizer (a chat template's turn markers)."""
    specials = [t for t in tokenizer.all_special_tokens if t]
    opening = next((t for t in specials if "start" in t), specials[0])
    closing = next((t for t in specials if "end" in t and t != opening), specials[-1])
    return opening, closing


def conversation(tokenizer, contents) -> str:
    opening, closing = framing(tokenizer)
    return "".join(f"{opening}{'user' if i % 2 == 0 else 'assistant'}\n{text}{closing}\n"
                   for i, text in enumerate(contents))


@pytest.fixture(params=["qwen", "llama"])
def tokenizer(request, qwen_tokenizer, llama_tokenizer):
    return {"qwen": qwen_tokenizer, "llama": llama_tokenizer}[request.param]


def test_growing_conversation_matches_the_full_encoding_and_reuses_its_prefix(tokenizer) -> None:
    encoder = PrefixReusingEncoder(tokenizer)
    contents, reused = [], []
    for text in ODD_CONTENTS * 2:
        contents.append(text)
        prompt = conversation(tokenizer, contents) + framing(tokenizer)[0] + "assistant\n"
        assert encoder.encode(prompt) == tokenizer.encode(prompt, add_special_tokens=False)
        reused.append(encoder.last_reused_chars)
    assert all(later > 0 for later in reused[2:]) and reused[-1] > reused[len(reused) // 2]


def test_branches_edits_and_side_requests_still_match(tokenizer) -> None:
    encoder = PrefixReusingEncoder(tokenizer, keep=2)
    main = conversation(tokenizer, ODD_CONTENTS)
    opening, closing = framing(tokenizer)
    cut_inside_a_token = main[: main.rindex(closing) + 3]
    variants = [main, conversation(tokenizer, ["quota"]), main + "extra words", main.replace("wörld", "world"),
                cut_inside_a_token, cut_inside_a_token + "x" + closing, main + " " + opening + " spaced " + closing,
                conversation(tokenizer, ODD_CONTENTS[:3]) + "   " + closing, main[:-1], main]
    for prompt in variants:
        assert encoder.encode(prompt) == tokenizer.encode(prompt, add_special_tokens=False), prompt[-60:]


def test_a_side_request_between_turns_does_not_cost_the_main_conversation_its_reuse(tokenizer) -> None:
    encoder = PrefixReusingEncoder(tokenizer)
    turn = conversation(tokenizer, ODD_CONTENTS) + framing(tokenizer)[0] + "assistant\n"  # the generation prompt
    encoder.encode(turn)
    encoder.encode(conversation(tokenizer, ["title this conversation"]))
    next_turn = turn + "I will read it." + framing(tokenizer)[1] + "\n" + framing(tokenizer)[0] + "assistant\n"
    assert encoder.encode(next_turn) == tokenizer.encode(next_turn, add_special_tokens=False)
    assert encoder.last_reused_chars > len(turn) - len(ODD_CONTENTS[-1])  # the last message was not encoded again


def test_common_prefix_length() -> None:
    assert [common_prefix_length(a, b) for a, b in [("", ""), ("abc", "abd"), ("abc", "abc"), ("ab", "abc"),
                                                     ("x", "y"), ("a" * 1000 + "b", "a" * 1000 + "c")]] == [
        0, 2, 3, 2, 0, 1000]
