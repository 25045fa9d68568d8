"""Request bodies (and WebSocket frames) as JSON objects: parsed strictly, and off the event loop when big.

    body = await read_json_object(request)              # a dict, or InvalidRequest (a 400 in the route's shape)
    body = await app[BODY_PARSING].parse(frame_text)     # the same for a WebSocket text frame

Strict where Python's json module is lenient or fails with an exception no client should see:

- the bytes must be UTF-8 (json.loads would pass UTF-8-encoded surrogates through, and guess UTF-16/32);
- no `NaN` / `Infinity`, no float that overflows to infinity (`1e999`), no integer beyond Python's digit limit;
- nesting at most `MAX_DEPTH` levels (the parser recurses: ~1,000 levels raise `RecursionError`);
- no lone UTF-16 surrogate (`"\\ud800"`) in any string or key: the tokenizer, SQLite and every UTF-8 encoder
  raise on one, wherever in the pipeline it would get to.

Bodies over `OFF_LOOP_BYTES` are parsed in the default executor, at most `PARSE_SLOTS` at once (a large body
takes a while and several times its size in memory; other requests keep being served meanwhile).
Once `TRIM_AFTER_BYTES` of bodies have come in, the first `TRIM_QUIET_S` without a new one gives the freed
heap back to the OS (zllm/memory.py): without it RSS stays hundreds of MB up after a burst of big bodies.
"""

from __future__ import annotations

import asyncio
import json
import math
import re

from aiohttp import web

from zllm import memory
from zllm.api.fields import json_type_name
from zllm.errors import InvalidRequest

# deeper than any real request (JSON schemas in tools nest a few tens of levels), and far from the
# recursion limit of anything downstream that walks the tree (json.dumps, templates, schema compilers)
MAX_DEPTH = 128
OFF_LOOP_BYTES = 1 << 20
PARSE_SLOTS = 2
TRIM_AFTER_BYTES = 8 << 20
TRIM_QUIET_S = 1.0

# a \u escape of a UTF-16 surrogate: only a body holding one can decode to a string with a lone surrogate
# (pairs decode to one code point; raw surrogate bytes are not UTF-8 and fail decoding first)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyParsing:
    """One app's parse slots for big bodies, and when it last gave freed memory back."""

    def __init__(self, *, slots: int = PARSE_SLOTS, trim_after_bytes: int = TRIM_AFTER_BYTES,
                 trim_quiet_s: float = TRIM_QUIET_S):
        self.slots = asyncio.Semaphore(slots)
        self.trim_after_bytes = trim_after_bytes
        self.trim_quiet_s = trim_quiet_s
        self._bytes_since_trim = 0
        self._trim_timer: asyncio.TimerHandle | None = None

    async def parse(self, raw: bytes | str) -> dict:
        """`parse_json_object(raw)`, in the executor under a slot when `raw` is big."""
        self._note(len(raw))
        if len(raw) <= OFF_LOOP_BYTES:
            return parse_json_object(raw)
        async with self.slots:
            return await asyncio.get_running_loop().run_in_executor(None, parse_json_object, raw)

    def _note(self, size: int) -> None:
        self._bytes_since_trim += size
        if self._bytes_since_trim < self.trim_after_bytes:
            return
        if self._trim_timer is not None:
            self._trim_timer.cancel()  # still busy: wait for the quiet after this body
        self._trim_timer = asyncio.get_running_loop().call_later(self.trim_quiet_s, self._trim)

    def _trim(self) -> None:
        self._trim_timer = None
        self._bytes_since_trim = 0
        asyncio.get_running_loop().run_in_executor(None, memory.trim)


BODY_PARSING = web.AppKey("zllm.body_parsing", BodyParsing)


async def read_json_object(request: web.Request) -> dict:
    return await request.app[BODY_PARSING].parse(await request.read())


def parse_json_object(raw: bytes | str) -> dict:
    # text from bytes was decoded strictly: a surrogate in it can only come from an escape
    text, raw_surrogates = (_utf8_text(raw), False) if isinstance(raw, bytes) else (raw, True)
    if not text.strip():
        raise InvalidRequest("the request body is empty; expected a JSON object")
    body = _loads(text)
    if not isinstance(body, dict):
        raise InvalidRequest(f"the request body must be a JSON object, got {json_type_name(body)}")
    surrogates = _may_hold_surrogates(text, raw_surrogates)
    _check_tree(body, depth=_may_nest_deeper_than(text, MAX_DEPTH), surrogates=surrogates)
    return body


def _utf8_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")  # strict: invalid bytes and encoded surrogates fail here
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: not UTF-8 (byte {exc.start})") from None


def _loads(text: str) -> object:
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} "
                             f"column {exc.colno}") from None
    except RecursionError:
        raise _too_deep() from None
    except ValueError:  # an integer of more digits than int() takes (sys.get_int_max_str_digits)
        raise InvalidRequest("the request body holds a number too large to be a value of any field") from None


def _refuse_constant(name: str) -> float:
    raise InvalidRequest(f"the request body is not valid JSON: `{name}` is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise InvalidRequest(f"the request body holds a number out of range: {literal[:40]}")
    return value


def _may_nest_deeper_than(text: str, depth: int) -> bool:
    # nesting `depth` levels takes `depth` openers: most bodies have too few to need the walk
    return text.count("[") + text.count("{") > depth


def _may_hold_surrogates(text: str, raw: bool) -> bool:
    return _SURROGATE_ESCAPE.search(text) is not None or (raw and _has_lone_surrogate([text]))


def _check_tree(body: dict, *, depth: bool, surrogates: bool) -> None:
    """Walk the parsed body, one level at a time (no recursion), when it may nest too deep or hold a lone
    surrogate: a level's children are gathered by a comprehension, which is what keeps the walk cheap."""
    level: list = [body]
    levels = 0
    while level and (depth or surrogates):
        levels += 1
        if levels > MAX_DEPTH:
            raise _too_deep()
        if surrogates and _has_lone_surrogate(_strings_of(level)):
            raise _lone_surrogate(body)
        children = [child for value in level for child in (value.values() if type(value) is dict else value)]
        level = [child for child in children if type(child) in _CONTAINERS]


_CONTAINERS = (dict, list)


def _has_lone_surrogate(strings: list[str]) -> bool:
    # isascii() reads a flag (no scan), and UTF-8 encoding fails on a surrogate at C speed: both far faster
    # than a regex over the text
    unicode = "".join(text for text in strings if not text.isascii())
    try:
        unicode.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _strings_of(level: list) -> list[str]:
    """The keys and string values held directly by this level's containers."""
    keys = [key for value in level if type(value) is dict for key in value]
    values = [child for value in level for child in (value.values() if type(value) is dict else value)
              if type(child) is str]
    return keys + values


def _too_deep() -> InvalidRequest:
    return InvalidRequest(f"the request body nests deeper than {MAX_DEPTH} levels")


def _lone_surrogate(body: dict) -> InvalidRequest:
    param = _surrogate_path(body, "")
    where = f"`{param}`" if param else "a field name"
    return InvalidRequest(f"{where} holds a lone UTF-16 surrogate (\\ud800-\\udfff escape without its pair); "
                          "text must be valid Unicode", param=param or None)


def _surrogate_path(value: object, path: str) -> str:
    """Where the first lone surrogate is, as `messages[0].content` (walked only once one was found, over a
    tree at most MAX_DEPTH deep)."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else ""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        if isinstance(key, str) and _SURROGATE.search(key):
            return path
        found = _surrogate_path(child, _child_path(path, key))
        if found:
            return found
    return ""


def _child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key
