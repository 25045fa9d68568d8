"""Output options shared by the three APIs: structured output formats and the reasoning switch.

    Chat       response_format {"type": "json_schema", "json_schema": {"name": "n", "schema": {...}}}
               response_format {"type": "json_object"}                  reasoning_effort "none" | "low" | ...
    Responses  text.format {"type": "json_schema", "name": "n", "schema": {...}}   reasoning {"effort": ...}
    Anthropic  thinking {"type": "enabled" | "adaptive" | "disabled"}

All become canonical `ResponseFormat` (answer text constrained to the schema by the fence) and
`ChatRequest.thinking` (True / False / None = the model family's default).
"""

from __future__ import annotations

from zllm.api.fields import check_type, optional, required
from zllm.canonical import ResponseFormat
from zllm.errors import InvalidRequest

TEXT = "text"
JSON_SCHEMA = "json_schema"
JSON_OBJECT = "json_object"
ANY_JSON_OBJECT = {"type": "object"}

# effort values that mean "do not reason" (OpenAI: reasoning_effort / reasoning.effort)
NO_REASONING_EFFORTS = ("none", "minimal")
REASONING_EFFORTS = ("low", "medium", "high", "xhigh")


def decode_format(raw: dict | None, param: str, *, nested_schema: bool) -> ResponseFormat | None:
    """`raw` is Chat's `response_format` (schema under "json_schema", `nested_schema=True`) or Responses'
    `text.format` (name and schema at the top level)."""
    if raw is None:
        return None
    kind = required(raw, "type", "string", f"{param}.type")
    if kind == TEXT:
        return None
    if kind == JSON_OBJECT:
        return ResponseFormat(schema=ANY_JSON_OBJECT, name=JSON_OBJECT)
    if kind != JSON_SCHEMA:
        raise InvalidRequest(f"unknown {param} type {kind!r}; expected text, json_schema or json_object",
                             param=f"{param}.type")
    spec = required(raw, JSON_SCHEMA, "object", f"{param}.{JSON_SCHEMA}") if nested_schema else raw
    where = f"{param}.{JSON_SCHEMA}" if nested_schema else param
    schema = optional(spec, "schema", "object", f"{where}.schema")
    name = optional(spec, "name", "string", f"{where}.name") or "response"
    return ResponseFormat(schema=schema if schema is not None else ANY_JSON_OBJECT, name=name)


def thinking_from_effort(effort: object, param: str) -> bool | None:
    if effort is None:
        return None
    effort = check_type(effort, "string", param)
    if effort in NO_REASONING_EFFORTS:
        return False
    if effort in REASONING_EFFORTS:
        return True
    allowed = ", ".join((*NO_REASONING_EFFORTS, *REASONING_EFFORTS))
    raise InvalidRequest(f"`{param}` must be one of {allowed}; got {effort!r}", param=param)


def thinking_from_anthropic(body: dict) -> bool | None:
    thinking = optional(body, "thinking", "object")
    if thinking is None:
        return None
    kind = required(thinking, "type", "string", "thinking.type")
    if kind in ("enabled", "adaptive"):
        return True
    if kind == "disabled":
        return False
    raise InvalidRequest(f"`thinking.type` must be enabled, adaptive or disabled; got {kind!r}",
                         param="thinking.type")
