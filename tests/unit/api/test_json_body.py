"""Request bodies are parsed strictly: every way Python's json module would let bad input through (or fail on
it with an exception no client should see) is an `InvalidRequest` that says what is wrong."""

from __future__ import annotations

import asyncio
import json

import pytest

from zllm import memory
from zllm.api.json_body import MAX_DEPTH, OFF_LOOP_BYTES, BodyParsing, parse_json_object
from zllm.errors import InvalidRequest


@pytest.mark.parametrize(("raw", "message_part"), [
    (b'{"a": NaN}', "`NaN` is not a JSON number"),
    (b'{"a": -Infinity}', "`-Infinity` is not a JSON number"),
    (b'{"a": 1e999}', "out of range: 1e999"),
    (b'{"a": ' + b"9" * 5000 + b"}", "number too large"),
    (b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", f"deeper than {MAX_DEPTH} levels"),
    (b"[" * 100_000, f"deeper than {MAX_DEPTH} levels"),
    (b'{"a": "\xff"}', "not UTF-8 (byte 7)"),
    (b'{"a": "\xed\xa0\x80"}', "not UTF-8"),  # a surrogate encoded in UTF-8 bytes
    ("{\"a\": 1}".encode("utf-16"), "not UTF-8"),
    (b'{"a": 1', "not valid JSON: Expecting ',' delimiter at line 1 column 8"),
    (b'{"messages": [{"content": "a\\ud800b"}]}', "`messages[0].content` holds a lone UTF-16 surrogate"),
    (b'{"x": {"\\udfff": 1}}', "`x` holds a lone UTF-16 surrogate"),
    (b'{"\\udbff": 1}', "a field name holds a lone UTF-16 surrogate"),
])
def test_bad_bodies_are_invalid_requests(raw: bytes, message_part: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_json_object(raw)
    assert message_part in caught.value.message
    assert "Error" not in caught.value.message  # no exception class names: the client sees this text


def test_the_surrogate_is_named_by_its_field() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_json_object(b'{"tools": [{"function": {"description": "\\udc00"}}]}')
    assert caught.value.param == "tools[0].function.description"


@pytest.mark.parametrize("raw", [
    b'{"text": "\\ud83d\\ude00 a pair is one emoji"}',
    '{"text": "\U0001f600 raw UTF-8"}'.encode(),
    b'{"text": "\\\\ud800 is an escaped backslash, not a surrogate"}',
    b"\xef\xbb\xbf{\"bom\": true}",
    b'{"a": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}",
    b'{"big": 1e308, "small": -1e-320, "int": 18446744073709551616}',
])
def test_valid_bodies_pass_unchanged(raw: bytes) -> None:
    assert parse_json_object(raw) == json.loads(raw.decode("utf-8-sig"))


def test_nesting_just_past_the_limit_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="deeper than"):
        parse_json_object(b'{"a": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}")


def test_a_websocket_frame_is_text_and_is_held_to_the_same_rules() -> None:
    assert parse_json_object('{"a": "é"}') == {"a": "é"}
    with pytest.raises(InvalidRequest, match="lone UTF-16 surrogate"):
        parse_json_object('{"a": "\ud800"}')  # a str may carry one raw, not only as an escape


def test_big_bodies_are_parsed_off_the_loop_a_few_at_a_time(monkeypatch) -> None:
    parsing = BodyParsing(slots=1, trim_after_bytes=1 << 40)
    big = json.dumps({"text": "x" * OFF_LOOP_BYTES}).encode()
    in_flight = {"now": 0, "most": 0}

    def counting_parse(raw):
        in_flight["now"] += 1
        in_flight["most"] = max(in_flight["most"], in_flight["now"])
        try:
            return json.loads(raw)
        finally:
            in_flight["now"] -= 1

    monkeypatch.setattr("zllm.api.json_body.parse_json_object", counting_parse)

    async def main() -> list[dict]:
        return await asyncio.gather(*(parsing.parse(big) for _ in range(4)))

    assert all(len(body["text"]) == OFF_LOOP_BYTES for body in asyncio.run(main()))
    assert in_flight["most"] == 1


def test_freed_memory_is_given_back_once_bodies_stop_coming(monkeypatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append(1) or True)
    parsing = BodyParsing(trim_after_bytes=100, trim_quiet_s=0.05)

    async def main() -> None:
        await parsing.parse(b'{"a": 1}')
        await asyncio.sleep(0.1)
        assert not trims, "under the threshold: nothing to give back"
        for _ in range(5):
            await parsing.parse(json.dumps({"a": "x" * 60}).encode())
            await asyncio.sleep(0.01)  # still busy: the trim waits for the quiet
        assert not trims
        await asyncio.sleep(0.2)

    asyncio.run(main())
    assert trims == [1]


def test_malloc_trim_is_callable_here() -> None:
    assert memory.trim() in (True, False)
