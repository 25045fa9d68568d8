"""Fence rules for a tagged parameter's value where its markup says more than "raw string or JSON" (grammar.py's
`params` calls these): the value's type word in the joiner (Kimi K3, format.py `type_words`), and nested values
written as elements (MiniMax M3, xml_values.py). Each returns the rule text from the joiner (typed) or the value
(elements) through the parameter's closer `closer`.
"""

from __future__ import annotations

import json

from zllm.dialects.base import CANONICAL_JSON_GUIDANCE
from zllm.dialects.glm.format import is_string_schema
from zllm.dialects.string_values import raw_string_terminal

_ANY_KINDS = ("string", "integer", "number", "boolean", "object", "array", "null")


def typed_value(w, name: str, schema: dict, closer: str) -> str:
    """`" type="WORD"<|sep|>` then the value as that type is written (strings raw, others JSON), one
    alternative per type the schema allows."""
    f = w.f
    alternatives = []
    for kind in _kinds(schema):
        mid = w.lits(f.mid_of(kind))
        if kind == "string":
            alternatives.append(f"{mid} {w.string_value(f'{name}_s', _only(schema, 'string'), closer=closer)}")
        elif kind == "null":
            alternatives.append(f'{mid} "null" {w.lits(closer)}')
        else:
            alternatives.append(f"{mid} {_json(_only(schema, kind))} {w.lits(closer)}")
    return f"({' | '.join(alternatives)})"


def xml_value(w, name: str, schema: dict, closer: str) -> str:
    """A non-string value as elements in the parameters' markup (numbers and booleans as their JSON, objects
    as their properties' elements in schema order, arrays as `xml_item` elements), then `closer`."""
    f = w.f
    alternatives = []
    for number, kind in enumerate(_kinds(schema, nested=False)):
        part = f"{name}_{number}"
        if kind == "string":
            alternatives.append(_leaf_string(w, part, _only(schema, "string"), closer))
        elif kind in ("integer", "number", "boolean"):
            alternatives.append(f"{_json(_only(schema, kind))} {w.lits(closer)}")
        elif kind == "null":  # left out of an object; an empty element in an array
            alternatives.append(w.lits(closer))
        elif kind == "object":
            alternatives.append(f"{_object(w, part, schema)} {w.lits(closer)}".strip())
        else:
            items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
            item_closer = f.close_of(f.xml_item)
            inner = xml_value(w, f"{part}_i", items, item_closer)
            item = w.rule(f"{part}_item", f"{w.lits(f.param_open + f.xml_item + f.param_mid)} {inner}")
            alternatives.append(f"{item}* {w.lits(closer)}")
    return f"({' | '.join(alternatives)})"


def _object(w, name: str, schema: dict) -> str:
    """The properties as elements in schema order, optional ones left out (an object without properties: {})."""
    f = w.f
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required") or ())
    parts = []
    for number, (key, sub) in enumerate(properties.items()):
        inner = xml_value(w, f"{name}_p{number}", sub if isinstance(sub, dict) else {}, f.close_of(key))
        rule = w.rule(f"{name}_p{number}", f"{w.lits(f.param_open + key + f.param_mid)} {inner}")
        parts.append(rule if key in required else f"{rule}?")
    return " ".join(parts)


def _leaf_string(w, name: str, schema: dict, closer: str) -> str:
    """A string inside elements: raw text that opens no element (the reader would take it for one)."""
    from zllm.dialects.derived.grammar import _regex

    f = w.f
    body = f"{w.free_text(nonempty=False)} & ~/(?s:.*){_regex(f.param_open)}(?s:.*)/"
    bounded = raw_string_terminal(schema)
    if bounded:
        body += f" & {bounded}"
    terminal = w.terminal(f"{name.upper()}_LEAF", body)
    first = w.pieces(closer)[0]
    if w.markup.is_single(first):
        return f"{terminal} {w.lits(closer)}"
    rule = w.rule(f"{name}_leaf", f"{terminal} {json.dumps(first, ensure_ascii=False)}", lazy=True)
    rest = closer[len(first):]
    return f"{rule} {w.lits(rest)}" if rest else rule


def _kinds(schema: dict, *, nested: bool = True) -> list[str]:
    """The JSON types a value may take; any where the schema names none (`nested` False: any scalar, so that a
    schema-less value's rules end)."""
    if is_string_schema(schema):
        return ["string"]
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else [k for k in (kind or ()) if isinstance(k, str)]
    return [k for k in kinds if k in _ANY_KINDS] or list(_ANY_KINDS if nested else _ANY_KINDS[:4])


def _only(schema: dict, kind: str) -> dict:
    return {**schema, "type": kind}


def _json(schema: dict) -> str:
    return f"%json {json.dumps({**schema, 'x-guidance': CANONICAL_JSON_GUIDANCE}, ensure_ascii=False)}"
