"""Why a prefix-cache lookup missed: the causes `explain-miss` can name, and the text clues behind them.

A clue looks at two texts that should have been equal, the cached side and the request side, at the first
character where they differ (`p`). Texts are whole strings when both canonical requests are known (a message's
content, a tool's description) and truncated windows when they come from a daemon near-miss record (24
decoded tokens on each side of the divergence, `truncated=True`): then only what both windows show counts.

    cached   …Current time: 2025-06-01 10:00:00 UTC\\nYou are…      →  timestamp: `2025-06-01 10:00:00`
    request  …Current time: 2025-06-01 10:05:00 UTC\\nYou are…          became `2025-06-01 10:05:00`

Clues, most specific first: a per-session stamp (a billing header, a UUID, a `session_id: …`, an opaque id),
a timestamp, JSON spelled differently (escapes, separators, key order), whitespace, chat-template markup.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum


class Cause(str, Enum):
    CHANGED_TOOL_SCHEMA = "changed_tool_schema"
    REORDERED_TOOLS = "reordered_tools"
    TOOLS_ADDED_OR_REMOVED = "tools_added_or_removed"
    TIMESTAMP = "timestamp"
    SESSION_STAMP = "session_stamp"
    WHITESPACE = "whitespace"
    JSON_SERIALIZATION = "json_serialization"
    TEMPLATE_CHANGE = "template_change"
    DIFFERENT_MODEL = "different_model"
    DIFFERENT_NAMESPACE = "different_namespace"
    EDITED_HISTORY = "edited_history"
    CACHE_BUSTER = "cache_buster"  # a known client buster (busters.py) that zllm reports, not removes
    CHANGED_SETTING = "changed_setting"  # thinking, tool choice or response format changed the prompt
    NO_MISS = "no_miss"
    UNKNOWN = "unknown"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Cause.CHANGED_TOOL_SCHEMA: "changed tool schema",
    Cause.REORDERED_TOOLS: "reordered tools",
    Cause.TOOLS_ADDED_OR_REMOVED: "tools added or removed",
    Cause.TIMESTAMP: "timestamp in the prompt",
    Cause.SESSION_STAMP: "per-session stamp",
    Cause.WHITESPACE: "whitespace change",
    Cause.JSON_SERIALIZATION: "JSON serialization change",
    Cause.TEMPLATE_CHANGE: "template change",
    Cause.DIFFERENT_MODEL: "different model",
    Cause.DIFFERENT_NAMESPACE: "different namespace",
    Cause.EDITED_HISTORY: "edited history",
    Cause.CACHE_BUSTER: "client cache-buster",
    Cause.CHANGED_SETTING: "changed setting",
    Cause.NO_MISS: "no miss",
    Cause.UNKNOWN: "unknown",
}


@dataclass(frozen=True)
class Diagnosis:
    cause: Cause
    detail: str  # one sentence a person can act on


_BILLING = re.compile(r"x-anthropic-billing-header:[^\n]*")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_SESSION_FIELD = re.compile(
    r"""(?i)\b(?:session|conversation|request|trace|thread|run|client)[ _-]?(?:id|key)\b["']?\s*[:=]\s*["']?[\w.:-]+""")
_TIMESTAMPS = tuple(re.compile(p) for p in (
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:\s?(?:Z|UTC|[+-]\d{2}:?\d{2}))?",
    r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s?[AaPp]\.?[Mm]\.?)?",
    r"\b\d{1,2}/\d{1,2}/\d{2,4}\b",
    r"(?i)\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b",
    r"(?i)\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.? \d{1,2}(?:st|nd|rd|th)?(?:,? \d{4})?",
    r"\b1[6-9]\d{8}(?:\.\d+)?\b",  # unix seconds, 2020s-2030s
))
# a run of word characters that looks like a minted id: long, and mixing digits with letters
_WORD = re.compile(r"[\w-]+")
_MARKUP = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?think>|\[/?INST\]|</?s>|<[｜|][^<>]{1,40}[｜|]>|</?tool_call>")
_JSON_HINT = re.compile(r"""["'][\w$.-]*["']\s*:|\{\s*"|\[\s*[{"]""")
_UNICODE_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")
_JSON_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:')


def first_difference(old: str, new: str) -> int | None:
    """Index of the first differing character; None when one text is a prefix of the other."""
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return i
    return None if len(old) == len(new) else min(len(old), len(new))


def diagnose_text(old: str, new: str, *, where: str, truncated: bool = False) -> Diagnosis | None:
    """What changed between `old` (cached) and `new` (request), if a clue says; None when none does."""
    p = first_difference(old, new)
    if p is None or (truncated and p >= min(len(old), len(new))):
        return None  # equal, or the windows end before they show a difference
    for clue in (_session_clue, _timestamp_clue, _json_clue, _whitespace_clue, _markup_clue):
        found = clue(old, new, p, where, truncated)
        if found:
            return found
    return None


def _covering(pattern: re.Pattern, text: str, p: int) -> str | None:
    """The match of `pattern` in `text` that contains (or ends at) character `p`."""
    for match in pattern.finditer(text):
        if match.start() <= p <= match.end() and match.end() > match.start():
            return match.group()
        if match.start() > p:
            break
    return None


def _changed(pattern: re.Pattern, old: str, new: str, p: int) -> tuple[str, str] | None:
    a, b = _covering(pattern, old, p), _covering(pattern, new, p)
    return (a, b) if a and b and a != b else None


def _session_clue(old: str, new: str, p: int, where: str, truncated: bool) -> Diagnosis | None:
    for pattern, what in ((_BILLING, "a per-session billing header"), (_UUID, "a UUID"),
                          (_SESSION_FIELD, "a session id")):
        pair = _changed(pattern, old, new, p)
        if pair:
            return Diagnosis(Cause.SESSION_STAMP, f"{where} carries {what} that changes per session: "
                                                  f"`{_clip(pair[0])}` became `{_clip(pair[1])}`")
    if any(_changed(pattern, old, new, p) for pattern in _TIMESTAMPS):
        return None  # digits and dashes of a date: the timestamp clue names it better
    a, b = _covering(_WORD, old, p), _covering(_WORD, new, p)
    if a and b and a != b and _looks_minted(a) and _looks_minted(b):
        return Diagnosis(Cause.SESSION_STAMP, f"{where} carries an id that changes per session: "
                                              f"`{_clip(a)}` became `{_clip(b)}`")
    return None


def _looks_minted(word: str) -> bool:
    digits = sum(c.isdigit() for c in word)
    return len(word) >= 12 and 2 <= digits < len(word)


def _timestamp_clue(old: str, new: str, p: int, where: str, truncated: bool) -> Diagnosis | None:
    for pattern in _TIMESTAMPS:
        pair = _changed(pattern, old, new, p)
        if pair:
            return Diagnosis(Cause.TIMESTAMP, f"{where} carries a timestamp: `{pair[0]}` became `{pair[1]}`; "
                                              "move it to the end of the prompt or drop it")
    return None


def _json_clue(old: str, new: str, p: int, where: str, truncated: bool) -> Diagnosis | None:
    how = None
    if _same(_unescape(old), _unescape(new), truncated):
        how = "string escapes"
    elif _json_spacing(old, new, p) and _same(_squeeze(old), _squeeze(new), truncated):
        how = "separators or indentation"
    elif not truncated and _canonical_json(old) == _canonical_json(new):
        how = "key order or number spelling"
    elif truncated and _looks_like_json(old, new, p) and _keys_reordered(old[_member_start(old, p):],
                                                                         new[_member_start(new, p):]):
        how = "key order"
    if how is None:
        return None
    return Diagnosis(Cause.JSON_SERIALIZATION,
                     f"{where} holds the same JSON value spelled differently ({how}); serialize it one way")


def _whitespace_clue(old: str, new: str, p: int, where: str, truncated: bool) -> Diagnosis | None:
    if _same(_squeeze(old), _squeeze(new), truncated):
        return Diagnosis(Cause.WHITESPACE, f"{where} differs only in whitespace "
                                           f"({_show(old[p:p + 12])} vs {_show(new[p:p + 12])})")
    return None


def _markup_clue(old: str, new: str, p: int, where: str, truncated: bool) -> Diagnosis | None:
    a, b = _markup_near(old, p), _markup_near(new, p)
    if (a or b) and a != b:
        return Diagnosis(Cause.TEMPLATE_CHANGE, f"the chat template wrote different markup in {where} "
                                                f"({_show(a or old[p:p + 12])} vs {_show(b or new[p:p + 12])})")
    return None


def _markup_near(text: str, p: int) -> str | None:
    """Template markup that contains `p` or starts within a few characters of it."""
    for match in _MARKUP.finditer(text, max(0, p - 40)):
        if match.start() <= p + 2 and match.end() > p:
            return match.group()
    return None


def _same(a: str, b: str, truncated: bool) -> bool:
    """Equal; for truncated windows, equal as far as the shorter one goes (and it shows something)."""
    if not truncated:
        return a == b
    n = min(len(a), len(b))
    return n >= 4 and a[:n] == b[:n]


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _unescape(text: str) -> str:
    return _UNICODE_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text).replace("\\/", "/")


def _looks_like_json(old: str, new: str, p: int) -> bool:
    return any(_JSON_HINT.search(text[max(0, p - 60):p + 60]) for text in (old, new))


def _json_spacing(old: str, new: str, p: int) -> bool:
    """A whitespace change inside JSON: JSON nearby, and the change next to its punctuation."""
    return _looks_like_json(old, new, p) and (_after_json_punctuation(old, p) or _after_json_punctuation(new, p))


def _after_json_punctuation(text: str, p: int) -> bool:
    """The whitespace change sits next to JSON punctuation (`{"a":1}` vs `{"a": 1}`), not inside prose."""
    before = text[:p].rstrip()
    return bool(before) and before[-1] in ":,{[" or text[p:p + 1] in ("}", "]")


def _canonical_json(text: str) -> str:
    """`text` with every embedded JSON object or array re-serialized one canonical way."""
    out, i, decoder = [], 0, json.JSONDecoder()
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = decoder.raw_decode(text, i)
            except ValueError:
                pass
            else:
                out.append(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
                i = end
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _member_start(text: str, p: int) -> int:
    """Where the JSON object member holding character `p` starts (just after the `{` or `,` before it)."""
    return max(text.rfind("{", 0, p), text.rfind(",", 0, p)) + 1


def _keys_reordered(old_after: str, new_after: str) -> bool:
    """Both windows list JSON keys, the first ones differ, and each side's first key shows up on the other."""
    a, b = _JSON_KEY.findall(old_after), _JSON_KEY.findall(new_after)
    return bool(a and b) and a[0] != b[0] and a[0] in b and b[0] in a


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _show(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
