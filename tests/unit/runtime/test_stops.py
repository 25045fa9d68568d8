"""Stop strings across token boundaries (every grouping), stop tokens, and the per-request output processor."""

import itertools

import pytest

from tests.support.tiny_models import tiny_qwen_tokenizer
from zllm.canonical import FinishReason
from zllm.runtime.detokenizer import IncrementalDetokenizer, raw_decoder
from zllm.runtime.output import OutputProcessor
from zllm.runtime.stops import StopStringMatcher, StopTokens


def groupings(text: str):
    """Every way to cut `text` into consecutive non-empty pieces (2^(n-1) of them)."""
    for cuts in itertools.product([False, True], repeat=len(text) - 1):
        pieces, start = [], 0
        for i, cut in enumerate(cuts, start=1):
            if cut:
                pieces.append(text[start:i])
                start = i
        yield [*pieces, text[start:]]


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], str | None]:
    matcher = StopStringMatcher(stops)
    emitted = []
    for piece in pieces:
        text, matched = matcher.feed(piece)
        emitted.append(text)
        if matched is not None:
            return emitted, matched
    return [*emitted, matcher.flush()], None


@pytest.mark.parametrize(("text", "stops", "expected", "matched"), [
    ("ab END cd", ("END",), "ab ", "END"),
    ("xEENDy", ("END",), "xE", "END"),             # a false start right before the real one
    ("abcabd", ("abd",), "abc", "abd"),             # partial match abandoned then restarted
    ("xx</a>yy", ("</a>", "</b>"), "xx", "</a>"),
    ("12abcd", ("bcd", "ab"), "12", "ab"),          # earliest start wins
    ("no stop here", ("STOP",), "no stop here", None),
    ("ends with ST", ("STOP",), "ends with ST", None),  # held, then released by flush
    ("aaab", ("aab",), "a", "aab"),                  # overlapping self-prefix
])
def test_every_grouping_gives_the_same_result(text, stops, expected, matched) -> None:
    for pieces in groupings(text):
        emitted, got = run(stops, pieces)
        assert ("".join(emitted), got) == (expected, matched), pieces


def test_text_that_may_start_a_stop_is_never_streamed_early() -> None:
    matcher = StopStringMatcher(("</answer>",))
    assert matcher.feed("value</ans") == ("value", None)
    assert matcher.feed("w") == ("", None)  # "</answ" may still become "</answer>"
    assert matcher.feed("x") == ("</answx", None)  # now it cannot
    assert matcher.feed("</answer>tail") == ("", "</answer>")


def test_no_stops_passes_text_through() -> None:
    assert StopStringMatcher(()).feed("anything") == ("anything", None)


def test_stop_tokens() -> None:
    stops = StopTokens(frozenset({2}), frozenset({2, 7}))
    assert stops.reason(2) is FinishReason.STOP  # the model's end of turn wins
    assert stops.reason(7) is FinishReason.STOP_SEQUENCE
    assert stops.reason(3) is None


# ------------------------------------------------------------------------------------ output processor

IM_END = 151645


@pytest.fixture(scope="module")
def qwen():
    return tiny_qwen_tokenizer()


def processor(tokenizer, *, stops=(), stop_ids=(), max_tokens=100) -> OutputProcessor:
    token_text = raw_decoder(tokenizer, skip_special_tokens=False)
    return OutputProcessor(IncrementalDetokenizer(tokenizer), StopTokens(frozenset({IM_END}), frozenset(stop_ids)),
                           stops, max_tokens, lambda t: token_text([t]))


def feed_all(proc: OutputProcessor, ids: list[int]):
    texts = []
    for token_id in ids:
        text, ending = proc.accept(token_id)
        texts.append(text)
        if ending is not None:
            return "".join(texts), ending
    return "".join(texts), None


def test_eos_ends_with_stop_and_its_text_is_not_emitted(qwen) -> None:
    ids = qwen.encode("Hi there 🎉", add_special_tokens=False) + [IM_END, 9707]
    proc = processor(qwen)
    text, ending = feed_all(proc, ids)
    assert (text, ending.reason, proc.completion_tokens) == ("Hi there 🎉", FinishReason.STOP, len(ids) - 1)


def test_client_stop_token_reports_its_text(qwen) -> None:
    ids = qwen.encode("a<tool_call>b", add_special_tokens=False)
    text, ending = feed_all(processor(qwen, stop_ids=(151657,)), ids)
    assert (text, ending.reason, ending.stop_sequence) == ("a", FinishReason.STOP_SEQUENCE, "<tool_call>")


def test_max_tokens_ends_with_length_and_flushes_held_text(qwen) -> None:
    ids = qwen.encode("abc EN", add_special_tokens=False)
    proc = processor(qwen, stops=("END",), max_tokens=len(ids))
    text, ending = feed_all(proc, ids)
    assert (text, ending.reason, proc.completion_tokens) == ("abc EN", FinishReason.LENGTH, len(ids))


def test_stop_string_split_across_tokens(qwen) -> None:
    ids = qwen.encode("The answer is 42.</answer> and more", add_special_tokens=False)
    assert "</answer>" not in [qwen.decode([t]) for t in ids]  # really split over several tokens
    text, ending = feed_all(processor(qwen, stops=("</answer>",)), ids)
    assert (text, ending.reason, ending.stop_sequence) == ("The answer is 42.", FinishReason.STOP_SEQUENCE,
                                                            "</answer>")


def test_stop_string_inside_a_multibyte_character_sequence(qwen) -> None:
    ids = qwen.encode("価格は🎉です", add_special_tokens=False)
    text, ending = feed_all(processor(qwen, stops=("🎉",)), ids)
    assert (text, ending.stop_sequence) == ("価格は", "🎉")
