"""Conformance harness shared by the dialect suites (tests/unit/dialects): run a parser over the same text whole, one piece per
character, one piece per token of a real tokenizer, and in random groupings; compare merged events.

    events = parse_all(lambda: dialect.parser(tools, thinking=False, new_call_id=counter()), text)
    assert_split_invariant(make_parser, text, tokenizer=qwen_tokenizer, groupings=100)
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable

from zllm.canonical import ReasoningDelta, TextDelta, ToolCallArgsDelta
from zllm.dialects.base import StreamParser


def counter(prefix: str = "call_") -> Callable[[], str]:
    """Deterministic call ids, so event lists from different runs compare equal."""
    numbers = itertools.count()
    return lambda: f"{prefix}{next(numbers)}"


def parse_all(make_parser: Callable[[], StreamParser], pieces: Iterable[str]) -> list:
    parser = make_parser()
    events = []
    for piece in ([pieces] if isinstance(pieces, str) else pieces):
        events.extend(parser.feed(piece))
    events.extend(parser.finish())
    return merged(events)


def merged(events: list) -> list:
    """Adjacent TextDelta / ReasoningDelta / same-index ToolCallArgsDelta joined; empty deltas dropped."""
    out: list = []
    for event in events:
        if isinstance(event, (TextDelta, ReasoningDelta)) and not event.text:
            continue
        if out and type(out[-1]) is type(event) and isinstance(event, (TextDelta, ReasoningDelta)):
            out[-1] = type(event)(out[-1].text + event.text)
        elif (out and isinstance(event, ToolCallArgsDelta) and isinstance(out[-1], ToolCallArgsDelta)
              and out[-1].index == event.index):
            out[-1] = ToolCallArgsDelta(event.index, out[-1].text + event.text)
        else:
            out.append(event)
    return out


def token_pieces(tokenizer, text: str) -> list[str]:
    """`text` cut where a real tokenizer cuts it (each token decoded alone; joined they give `text` back
    for the byte-level BPE vocabularies used here)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    return pieces if "".join(pieces) == text else list(text)


def random_groupings(text: str, count: int, seed: int = 0) -> Iterable[list[str]]:
    rng = random.Random(seed)
    for _ in range(count):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(0, 12)))) if len(text) > 1 else []
        bounds = [0, *cuts, len(text)]
        yield [text[a:b] for a, b in zip(bounds, bounds[1:])]


def assert_split_invariant(make_parser: Callable[[], StreamParser], text: str, *, tokenizer=None,
                           groupings: int = 100) -> list:
    """The merged events of every split equal those of the whole text; returns them."""
    whole = parse_all(make_parser, text)
    assert parse_all(make_parser, list(text)) == whole, "character by character differs from whole"
    if tokenizer is not None:
        assert parse_all(make_parser, token_pieces(tokenizer, text)) == whole, "token by token differs"
    for pieces in random_groupings(text, groupings):
        assert parse_all(make_parser, pieces) == whole, f"grouping {pieces!r} differs"
    return whole
