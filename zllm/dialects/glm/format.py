"""GLM-4.5 tool markup: the tags and the value typing shared by the renderer, the parser and the fence grammar.

A string parameter's value is raw text, anything else compact JSON; which is which comes from the tool's
schema (`is_string_schema`), so all three read a value the same way.
"""

from __future__ import annotations

import json

from zllm.canonical import FunctionTool

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
MARKUP: tuple[str, ...] = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN,
                           VALUE_CLOSE)
NL = "\n"
# slips the parser tolerates: a tag written in upper case means the tag
SLIPS: dict[str, str] = {tag.upper(): tag for tag in MARKUP}
SPELLINGS: tuple[str, ...] = MARKUP + tuple(SLIPS)


def spellings(*tags: str) -> tuple[str, ...]:
    """Each tag and its tolerated upper-case slip."""
    return tuple(tags) + tuple(tag.upper() for tag in tags)


# ------------------------------------------------------------------------------------------ value typing


def param_schemas(tool: FunctionTool | None) -> dict[str, dict]:
    """The tool's parameter schemas by name, in schema order ({} for an unknown tool)."""
    if tool is None:
        return {}
    properties = tool.parameters.get("properties")
    return {name: (schema if isinstance(schema, dict) else {}) for name, schema in (properties or {}).items()}


def is_string_schema(schema: dict | None) -> bool:
    """GLM writes a value raw (not JSON-quoted) exactly when its parameter is a string."""
    if not schema:
        return False
    kind = schema.get("type")
    if kind == "string":
        return True
    if isinstance(kind, list):
        return set(kind) - {"null"} == {"string"}
    if kind is None and "enum" in schema:
        return all(isinstance(choice, str) for choice in schema["enum"])
    return kind is None and isinstance(schema.get("const"), str)


def value_json(raw: str) -> str:
    """A non-string parameter's value as JSON text: the raw text if it is JSON, else the raw text as a string."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        value = raw
    return json.dumps(value, ensure_ascii=False)


def value_text(value: object, string_param: bool) -> str:
    """How GLM writes one argument value: strings raw, everything else as JSON text (", " / ": ").
    A string for a non-string parameter is quoted when its raw text would read back as other JSON."""
    if not isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if string_param or value_json(value) == json.dumps(value, ensure_ascii=False):
        return value
    return json.dumps(value, ensure_ascii=False)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def string_param(tool: FunctionTool | None, schemas: dict[str, dict], key: str) -> bool:
    # a free-form tool's one `input` is a string whatever its declared schema says
    return (tool is not None and tool.grammar is not None and key == "input") or is_string_schema(schemas.get(key))
