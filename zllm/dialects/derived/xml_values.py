"""Nested values written as elements in a tagged format's own parameter markup (format.py `xml_item`), MiniMax M3:

    {"a": [1, true], "c": "x"}   ↔   NS<a>NS<item>1NS</item>NS<item>trueNS</item>NS</a>NS<c>xNS</c>

where `NS<` / `>` / `NS</KEY>` are the format's `param_open` / `param_mid` / `param_close`, an array's items are
named `xml_item`, strings raw, numbers as Python writes them, booleans as JSON, null left out of an object (an
empty element in an array). The text is the same for values JSON tells apart (`7` / "7", [] / {} / ""), so the
reading takes the parameter's schema where it has one: the round trip of the text holds whichever it picks.

`write` spells a value as the template does (the probe compares it with the template's rendering); an
`XmlValueCursor` reads one parameter's value a character at a time up to its own closer (split-invariant: it
depends only on the characters), and `to_json` gives its JSON text once it closed.
"""

from __future__ import annotations

import json

from zllm.dialects.derived.format import CallFormat, split_slot


def write(value, fmt: CallFormat) -> str:
    if isinstance(value, dict):
        return "".join(element(k, v, fmt) for k, v in value.items() if v is not None)
    if isinstance(value, list):
        return "".join(element(fmt.xml_item, v, fmt) for v in value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def element(key: str, value, fmt: CallFormat) -> str:
    return f"{fmt.param_open}{key}{fmt.param_mid}{write(value, fmt)}{fmt.close_of(key)}"


class _Node:
    def __init__(self, name: str):
        self.name = name
        self.text = ""
        self.children: list[_Node] = []


class XmlValueCursor:
    """`step(ch)`: True once the value's own closer (`close_of(key)` at depth 0) is complete. `raw` holds the
    value's text without the closer; `broken` when the elements do not nest (read back as the raw text)."""

    def __init__(self, fmt: CallFormat, key: str):
        self.open = fmt.param_open
        self.mid = fmt.param_mid
        self.close_head, self.close_tail = split_slot(fmt.param_close)
        self.closer = fmt.close_of(key)
        self.key = key
        self.item = fmt.xml_item
        self.raw = ""
        self.root = _Node(key)
        self.stack = [self.root]
        self.tag = None  # the tag being read after `open`: its text so far
        self.broken = False
        self.done = False

    def step(self, ch: str) -> bool:
        self.raw += ch
        if self.broken:
            return self._closed_plainly()
        if self.tag is not None:
            self.tag += ch
            return self._in_tag()
        if self.raw.endswith(self.open):
            self.tag = ""
            self.stack[-1].text = self.stack[-1].text[:len(self.stack[-1].text) - len(self.open) + 1]
            return False
        self.stack[-1].text += ch
        return False

    def _in_tag(self) -> bool:
        tag, extra = self.tag, self.close_head[len(self.open):]
        closing = bool(extra) and tag.startswith(extra)
        end = self.close_tail if closing else self.mid
        if not closing and extra.startswith(tag):
            return False  # may still become a closing tag
        if not tag.endswith(end) or not end:
            if len(tag) > 256:
                self.broken = True
            return False
        name = tag[len(extra) if closing else 0:len(tag) - len(end)]
        self.tag = None
        if not closing:
            node = _Node(name)
            self.stack[-1].children.append(node)
            self.stack.append(node)
            return False
        if self.stack[-1].name != name:
            self.broken = True
            return self._closed_plainly()
        node = self.stack.pop()
        if not self.stack:
            self.raw = self.raw[:len(self.raw) - len(self.closer)]
            self.done = True
            return True
        return False

    def _closed_plainly(self) -> bool:
        if self.raw.endswith(self.closer):
            self.raw = self.raw[:len(self.raw) - len(self.closer)]
            self.done = True
        return self.done

    def to_json(self, schema: dict | None) -> str:
        if self.broken:
            return json.dumps(self.raw, ensure_ascii=False)
        return json.dumps(_value(self.root, schema or {}, self.item), ensure_ascii=False)


def _kinds(schema: dict) -> set[str]:
    kind = schema.get("type")
    return {kind} if isinstance(kind, str) else set(kind or ())


def _value(node: _Node, schema: dict, item: str):
    kinds = _kinds(schema)
    if node.children:
        names = {child.name for child in node.children}
        as_array = "array" in kinds or ("object" not in kinds and names == {item})
        if as_array:
            items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
            return [_value(child, items, item) for child in node.children]
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        return {child.name: _value(child, properties.get(child.name) or {}, item) for child in node.children}
    text = node.text
    if not text:
        return {} if kinds == {"object"} else [] if kinds == {"array"} else ""
    if text in ("true", "false") and (not kinds or "boolean" in kinds):
        return text == "true"
    if not kinds or kinds & {"integer", "number"}:
        try:
            number = json.loads(text)
        except ValueError:
            return text
        # a number where the schema says so; without a schema, only one the template writes back as this same
        # text (`1e5` is read as a string)
        if isinstance(number, (int, float)) and not isinstance(number, bool) and (kinds or str(number) == text):
            return number
    return text

