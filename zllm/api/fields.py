"""Typed access to decoded JSON request bodies, failing with `InvalidRequest` that names the field.

Shared by every protocol's decode.py so messages read the same everywhere:

    `messages[2].content` must be a string or an array, got number
    missing required parameter `model`
"""

from __future__ import annotations

from typing import Any, Literal

from zllm.errors import InvalidRequest

Kind = Literal["string", "integer", "number", "boolean", "object", "array"]

_PYTHON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
}

_ARTICLES = {"integer": "an integer", "object": "an object", "array": "an array"}

# every integer field is one of these at most (seeds, token counts): a bigger one would overflow where it lands
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def check_type(value: Any, kind: Kind, param: str) -> Any:
    """`value` if it is a JSON `kind`; integral floats pass as integers (`100.0` from JS clients)."""
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        value = int(value)
    numeric = kind in ("integer", "number")
    if not isinstance(value, _PYTHON_TYPES[kind]) or (numeric and isinstance(value, bool)):
        article = _ARTICLES.get(kind, f"a {kind}")
        raise InvalidRequest(f"`{param}` must be {article}, got {json_type_name(value)}", param=param)
    if kind == "integer" and not INT64_MIN <= value <= INT64_MAX:
        raise InvalidRequest(f"`{param}` is out of range: integers must fit in 64 bits", param=param)
    return value


def optional(obj: dict, key: str, kind: Kind, param: str | None = None) -> Any:
    """`obj[key]` checked as `kind`; None when absent or null."""
    value = obj.get(key)
    return None if value is None else check_type(value, kind, param or key)


def required(obj: dict, key: str, kind: Kind, param: str | None = None) -> Any:
    param = param or key
    if obj.get(key) is None:
        raise InvalidRequest(f"missing required parameter `{param}`", param=param)
    return check_type(obj[key], kind, param)


def decode_model(body: dict) -> str:
    """The `model` field every API requires: a non-empty string."""
    model = required(body, "model", "string")
    if not model.strip():
        raise InvalidRequest("`model` must not be empty", param="model")
    return model


_SAMPLING_KINDS: dict[str, Kind] = {"temperature": "number", "top_p": "number", "top_k": "integer"}


def sampling_fields(body: dict, *names: str) -> dict:
    """The sampling knobs among `names` that the body sets, typed and normalized, as `SamplingParams`
    keyword arguments; absent ones are left out so the canonical defaults apply."""
    fields: dict = {}
    for name in names:
        value = optional(body, name, _SAMPLING_KINDS[name])
        if value is not None:
            # vLLM-style clients send top_k=-1 for "off"
            fields[name] = max(value, 0) if name == "top_k" else float(value)
    return fields
