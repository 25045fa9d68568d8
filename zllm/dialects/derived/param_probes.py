"""Probes of how a tagged format (format.py) writes one parameter, beyond a string and a number: the closer that
names its key (MiniMax M3), the joiner that names the value's type (Kimi K3), nested values written as elements
(MiniMax M3). Each takes `written(value)`: the text the template writes for a parameter holding `value`, from
after its key to its closer (None where it leaves the parameter out).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from zllm.dialects.derived import xml_values
from zllm.dialects.derived.format import KEY_SLOT, TYPE_SLOT, CallFormat

# one value of each JSON type, spelled as no template writes by itself
_SAMPLES = {"string": "zq-ty", "integer": 48213, "number": 2.5, "boolean": True, "null": None,
            "object": {"zqo": 1}, "array": [1]}


def json_kind(value) -> str:
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if value is None:
        return "null"
    return "object" if isinstance(value, dict) else "array"


def keyed_closer(parts: dict, name_close: str, after: str) -> tuple[dict, str, str]:
    """A closer that names its key (`NS</KEY`) cut where the opener's key ends (`>`): the text that follows
    the key in the opener (`param_mid`) follows it in the closer too, not in the next opener."""
    mid, opener = parts["param_mid"], parts["param_open"]
    if not mid or not opener.startswith(mid) or opener == mid or not after.startswith(mid):
        return parts, name_close, after
    parts = {**parts, "param_open": opener[len(mid):], "param_close": parts["param_close"] + mid}
    return parts, name_close + mid, after[len(mid):]


def typed_values(written: Callable[[object], str | None], draft: CallFormat) -> dict:
    """`param_mid` with the value's type word as its slot, and the words, where the joiner differs by type
    (Kimi K3's `" type="string"<|sep|>` / `" type="number"<|sep|>`); {} where it does not."""
    mids = {}
    for kind, value in _SAMPLES.items():
        text = written(value)
        spelled = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if text is not None and text.endswith(spelled):
            mids[kind] = text[:len(text) - len(spelled)]
    if "string" not in mids or "integer" not in mids or mids["string"] == mids["integer"]:
        return {}
    head = _common(list(mids.values()), prefix=True)
    tail = _common([m[len(head):] for m in mids.values()], prefix=False)
    words = {kind: mid[len(head):len(mid) - len(tail)] for kind, mid in mids.items()}
    if not all(words.values()) or any(KEY_SLOT in w or TYPE_SLOT in w for w in words.values()):
        return {}
    if len({words.get(kind) for kind in ("string", "integer", "boolean")}) < 3:
        # a string / non-string flag (DeepSeek V3.2's `string="true"`), not a type: the hand-written DSML dialect
        return {}
    return {"param_mid": head + TYPE_SLOT + tail, "type_words": tuple(sorted(words.items()))}


def xml_item(written: Callable[[object], str | None], draft: CallFormat) -> str:
    """The element name of an array's items where nested values are written as elements in the parameters'
    markup (MiniMax M3's `NS<item>`), checked over a value with every JSON type nested; "" where they are not."""
    text = written(["zq-i"])
    if not text or not text.startswith(draft.param_open):
        return ""
    item = text[len(draft.param_open):].partition(draft.param_mid)[0]
    fmt = replace(draft, xml_item=item)
    if not item or text != xml_values.write(["zq-i"], fmt):
        return ""
    nested = {"a": [True, None, 1, "x y"], "b": {"c": "zq-c", "d": None}, "e": 2.5, "f": []}
    return item if written(nested) == xml_values.write(nested, fmt) else ""


def _common(texts: list[str], *, prefix: bool) -> str:
    if not texts:
        return ""
    first = texts[0]
    size = 0
    while size < len(first) and all(len(t) > size and (t[size] if prefix else t[-1 - size]) ==
                                    (first[size] if prefix else first[-1 - size]) for t in texts):
        size += 1
    return first[:size] if prefix else first[len(first) - size:]
