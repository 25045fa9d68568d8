"""The loop guard on real Qwen token ids: ordinary text, code, JSON and tables never trip it; degenerate loops
are banned, then stopped with REPETITION; grammar-forced tokens are never banned; repeated tool calls stop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zllm.runtime.engine_loop
from tests.support.tiny_models import tiny_qwen_tokenizer
from zllm.canonical import FinishReason
from zllm.runtime.loop_guard import LoopGuard, LoopGuardConfig

BOARD_ROW = '            [".", ".", ".", ".", ".", ".", ".", "."],\n'
CODE = (
    "import os\nimport sys\n\n\n"
    "class Board:\n"
    "    def __init__(self):\n"
    "        self.cells = [\n" + BOARD_ROW * 8 + "        ]\n"
    "        self.score = 0\n        self.moves = 0\n        self.turn = 0\n\n"
    "    def show(self):\n"
    '        print("-" * 40)\n        print("-" * 40)\n        print("-" * 40)\n'
    "        for row in self.cells:\n"
    '            print(" ".join(row))\n'
    '        print("-" * 40)\n'
    "\n\n# " + "-" * 96 + " helpers\n\n"
    "def test_a():\n    assert Board().score == 0\n\n\n"
    "def test_b():\n    assert Board().score == 0\n\n\n"
    "def test_c():\n    assert Board().score == 0\n"
)
JSON_ARRAY = json.dumps(
    [{"id": i, "name": f"user{i}", "active": True, "roles": ["reader"], "team": None} for i in range(40)], indent=2
)
TABLE = (
    "| feature | free | pro | team | enterprise |\n|---|---|---|---|---|\n"
    + "".join(f"| feature {i} | ✓ | ✓ | ✓ | ✓ |\n" for i in range(25))
    + "|" + "---|" * 30 + "\n"
)
PHRASE = " I will not talk in class."  # 7 Qwen tokens


def tokens(text: str) -> list[int]:
    return tiny_qwen_tokenizer().encode(text, add_special_tokens=False)


def assert_never_trips(token_ids: list[int], guard: LoopGuard | None = None) -> None:
    guard = guard or LoopGuard()
    for i, token_id in enumerate(token_ids):
        assert guard.next_banned() is None, f"a loop at token {i}: {guard.current_loop()}"
        guard.observe(token_id)
        assert guard.verdict() is None


@pytest.mark.parametrize("text", [CODE, JSON_ARRAY, TABLE], ids=["code", "json-array", "markdown-table"])
def test_ordinary_output_never_trips(text) -> None:
    assert_never_trips(tokens(text))


@pytest.mark.parametrize("text", [CODE, TABLE], ids=["code", "markdown-table"])
def test_the_samples_do_repeat_themselves(text) -> None:
    """What the defaults must tolerate: a guard wanting 4 repeats over 32 tokens would trip on them."""
    eager = LoopGuard(LoopGuardConfig(min_repeats=4, min_span=32))
    for token_id in tokens(text):
        eager.observe(token_id)
        if eager.current_loop() is not None:
            return
    raise AssertionError("the sample has no repetition worth testing against")


def test_a_real_source_file_never_trips() -> None:
    assert_never_trips(tokens(Path(zllm.runtime.engine_loop.__file__).read_text()))


class StubbornModel:
    """Writes `loop` forever; when its next token is banned it writes `detour` once and falls back into the
    loop — what a degenerate model does."""

    def __init__(self, loop: list[int], detour: int):
        self.loop, self.detour, self.position = loop, detour, 0

    def next(self, logits: dict[int, float]) -> int:
        token_id = self.loop[self.position % len(self.loop)]
        if logits.get(token_id) == float("-inf"):
            return self.detour  # the loop restarts from where it was
        self.position += 1
        return token_id


def run_guarded(model: StubbornModel, guard: LoopGuard, limit: int = 5000) -> tuple[int, list[int]]:
    """The runtime's step with no fence; returns (tokens written, banned ids) when the verdict stops it."""
    banned = []
    for written in range(1, limit + 1):
        logits: dict[int, float] = {}
        if (token_id := guard.ban(logits)) is not None:
            banned.append(token_id)
        guard.observe(model.next(logits))
        if (verdict := guard.verdict()) is not None:
            assert verdict.reason is FinishReason.REPETITION
            return written, banned
    raise AssertionError("the guard never stopped the loop")


@pytest.mark.parametrize(("text", "period"), [
    ("a" * 4000, 1),          # Qwen writes it as one 'aaaaaaaa' token over and over
    (" the" * 500, 1),
    (PHRASE * 200, 7),
], ids=["aaaa", "the-the", "7-token-phrase"])
def test_degenerate_loops_are_banned_then_stopped(text, period) -> None:
    loop_tokens = tokens(text)
    pattern = loop_tokens[len(loop_tokens) // 2:][:period]
    assert len(set(loop_tokens[len(loop_tokens) // 2:])) == len(set(pattern))  # the text is that loop
    config = LoopGuardConfig()
    guard = LoopGuard(config)
    written, banned = run_guarded(StubbornModel(pattern, detour=tokens(" ok")[0]), guard)
    assert len(banned) == config.max_bans and set(banned) <= set(pattern)
    # each loop needs span_needed tokens to be noticed; after max_bans of them, the next one stops it
    assert written <= (config.max_bans + 1) * (config.span_needed(period) + period + 1)


def test_a_loop_nothing_bans_stops_at_twice_its_span() -> None:
    guard, config = LoopGuard(), LoopGuardConfig()
    loop = tokens(" the" * 300)
    for written, token_id in enumerate(loop, start=1):
        guard.observe(token_id)  # the runtime never called ban()
        if guard.verdict() is not None:
            break
    assert written == 2 * config.span_needed(1)


def test_next_banned_is_the_token_one_period_back() -> None:
    guard = LoopGuard(LoopGuardConfig(min_span=14, min_repeats=2))
    phrase = tokens(PHRASE)
    for token_id in phrase * 2:
        guard.observe(token_id)
    assert guard.current_loop().period == 7 and guard.next_banned() == phrase[0]
    guard.observe(phrase[0])
    assert guard.next_banned() == phrase[1]


class FakeFence:
    def __init__(self, allowed: set[int]):
        self._allowed = allowed

    def allowed(self, token_id: int) -> bool:
        return token_id in self._allowed

    def allows_other_than(self, token_id: int) -> bool:
        return bool(self._allowed - {token_id})


def test_a_token_the_fence_forces_is_never_banned() -> None:
    guard = LoopGuard()
    the = tokens(" the")[0]
    for _ in range(LoopGuardConfig().min_span):
        guard.observe(the)
    assert guard.next_banned() == the
    logits: dict[int, float] = {}
    assert guard.ban(logits, FakeFence({the})) is None and logits == {} and guard.bans == 0
    assert guard.ban(logits, FakeFence({7})) is None and guard.bans == 0  # the fence already forbids it
    assert guard.ban(logits, FakeFence({the, 7})) == the and logits == {the: float("-inf")} and guard.bans == 1


def test_bans_are_forgiven_after_a_long_stretch_without_loops() -> None:
    config = LoopGuardConfig(min_span=8, min_repeats=4, forgive_after=50)
    guard = LoopGuard(config)
    for _ in range(8):
        guard.observe(5)
    assert guard.ban({}) == 5 and guard.bans == 1
    for token_id in range(100, 149):
        guard.observe(token_id)
    assert guard.bans == 1
    guard.observe(149)
    assert guard.bans == 0


def test_the_same_tool_call_three_times_stops() -> None:
    guard = LoopGuard()
    guard.observe_call("read_file", '{"path": "a.py", "limit": 10}')
    guard.observe_call("read_file", '{"path": "b.py", "limit": 10}')
    guard.observe_call("read_file", '{"limit": 10, "path": "a.py"}')  # same call, keys reordered
    assert guard.verdict() is None
    guard.observe_call("read_file", '{"path":"a.py","limit":10}')
    verdict = guard.verdict()
    assert verdict is not None and verdict.reason is FinishReason.REPETITION and "read_file" in verdict.detail


def test_config_rejects_nonsense() -> None:
    with pytest.raises(AssertionError):
        LoopGuardConfig(min_repeats=1)
