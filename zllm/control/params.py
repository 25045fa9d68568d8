"""Reading a control request's `params` object: typed, bounded, with an `invalid_request` error otherwise."""

from __future__ import annotations

from typing import Any

from zllm.errors import InvalidRequest


def int_param(params: dict[str, Any], name: str, default: int | None, *, minimum: int = 0) -> int | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidRequest(f"`{name}` must be an integer >= {minimum}, not {value!r}", param=name)
    return value


def float_param(params: dict[str, Any], name: str) -> float | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidRequest(f"`{name}` must be a number >= 0, not {value!r}", param=name)
    return float(value)


def str_param(params: dict[str, Any], name: str, default: str | None = None,
              choices: tuple[str, ...] | None = None) -> str | None:
    value = params.get(name, default)
    if value is None:
        return None
    if not isinstance(value, str) or (choices is not None and value not in choices):
        allowed = f"one of {', '.join(choices)}" if choices else "a string"
        raise InvalidRequest(f"`{name}` must be {allowed}, not {value!r}", param=name)
    return value


def bool_param(params: dict[str, Any], name: str, default: bool = False) -> bool:
    value = params.get(name, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"`{name}` must be true or false, not {value!r}", param=name)
    return value
