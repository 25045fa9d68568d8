"""Anthropic `context_management` ⇄ protocol-free context edits (api/context_edits).

    "context_management": {"edits": [
        {"type": "clear_thinking_20251015", "keep": "all" | {"type": "all"} | {"type": "thinking_turns", "value": 1}},
        {"type": "clear_tool_uses_20250919",
         "trigger": {"type": "input_tokens" | "tool_uses", "value": 6000},
         "keep": {"type": "tool_uses", "value": 3},
         "clear_at_least": {"type": "input_tokens", "value": 2000},
         "exclude_tools": ["Read"], "clear_tool_inputs": true | ["Bash"]},
        {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150000},
         "instructions": "…", "pause_after_compaction": false}]}

  → the answer's `"context_management": {"applied_edits": [
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 12, "cleared_input_tokens": 5210},
        {"type": "clear_thinking_20251015", "cleared_thinking_turns": 3, "cleared_input_tokens": 800}]}`
    (non-streaming: on the message; streaming: on the last `message_delta`), present whenever the request
    sent edits, `[]` when none cleared anything. A compaction answers with a `compaction` block instead.

Anthropic's defaults apply to what is left out. Anything else (an unknown edit type, a wrong unit, a negative
value, an edit listed twice) is a 400 naming the field. Compaction's trigger has no 50,000-token floor here:
local windows are often smaller than that.
"""

from __future__ import annotations

from zllm.api.context_edits import (
    INPUT_TOKENS,
    TOOL_USES,
    AppliedEdit,
    ClearThinking,
    ClearToolUses,
    Compact,
    ContextEdits,
    Threshold,
)
from zllm.api.fields import check_type, optional
from zllm.errors import InvalidRequest

FIELD = "context_management"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
_WIRE_KIND = {"clear_tool_uses": CLEAR_TOOL_USES, "clear_thinking": CLEAR_THINKING}
_CLEARED_FIELD = {"clear_tool_uses": "cleared_tool_uses", "clear_thinking": "cleared_thinking_turns"}


def decode_context_management(body: dict) -> ContextEdits | None:
    """The request's edits; None when it sent no `context_management` (the answer then carries none)."""
    raw = optional(body, FIELD, "object")
    if raw is None:
        return None
    items = optional(raw, "edits", "array", f"{FIELD}.edits") or []
    edits, seen = [], set()
    for i, item in enumerate(items):
        param = f"{FIELD}.edits[{i}]"
        item = check_type(item, "object", param)
        kind = item.get("type")
        decode = _DECODERS.get(kind) if isinstance(kind, str) else None
        if decode is None:
            raise InvalidRequest(f"`{param}.type` must be one of {', '.join(_DECODERS)}; got {kind!r}",
                                 param=f"{param}.type")
        if kind in seen:
            raise InvalidRequest(f"`{param}`: the edit {kind!r} is listed twice", param=param)
        seen.add(kind)
        edits.append(decode(item, param))
    return ContextEdits(tuple(edits))


def applied_edits_body(applied: tuple[AppliedEdit, ...]) -> dict:
    return {"applied_edits": [
        {"type": _WIRE_KIND[edit.kind], _CLEARED_FIELD[edit.kind]: edit.cleared,
         "cleared_input_tokens": max(0, edit.cleared_tokens)}
        for edit in applied]}


def _clear_tool_uses(item: dict, param: str) -> ClearToolUses:
    default = ClearToolUses()
    trigger = default.trigger
    if item.get("trigger") is not None:
        unit, value = _amount(item["trigger"], f"{param}.trigger", (INPUT_TOKENS, TOOL_USES), minimum=1)
        trigger = Threshold(unit, value)
    keep = default.keep
    if item.get("keep") is not None:
        keep = _amount(item["keep"], f"{param}.keep", (TOOL_USES,), minimum=0)[1]
    clear_at_least = 0
    if item.get("clear_at_least") is not None:
        clear_at_least = _amount(item["clear_at_least"], f"{param}.clear_at_least", (INPUT_TOKENS,), minimum=0)[1]
    excluded = _names(optional(item, "exclude_tools", "array", f"{param}.exclude_tools") or [],
                      f"{param}.exclude_tools")
    return ClearToolUses(trigger=trigger, keep=keep, clear_at_least=clear_at_least, exclude_tools=excluded,
                         clear_inputs=_clear_inputs(item.get("clear_tool_inputs"), f"{param}.clear_tool_inputs"))


def _clear_inputs(raw: object, param: str) -> bool | frozenset[str]:
    if raw is None or isinstance(raw, bool):
        return bool(raw)
    if isinstance(raw, list):
        return _names(raw, param)
    raise InvalidRequest(f"`{param}` must be a boolean or an array of tool names", param=param)


def _clear_thinking(item: dict, param: str) -> ClearThinking:
    raw = item.get("keep")
    if raw is None:
        return ClearThinking()
    if raw == "all" or (isinstance(raw, dict) and raw.get("type") == "all"):
        return ClearThinking(keep=None)
    return ClearThinking(keep=_amount(raw, f"{param}.keep", ("thinking_turns",), minimum=0)[1])


def _compact(item: dict, param: str) -> Compact:
    default = Compact()
    trigger = default.trigger
    if item.get("trigger") is not None:
        trigger = _amount(item["trigger"], f"{param}.trigger", (INPUT_TOKENS,), minimum=1)[1]
    instructions = optional(item, "instructions", "string", f"{param}.instructions")
    if instructions is not None and not instructions.strip():
        raise InvalidRequest(f"`{param}.instructions` must not be empty", param=f"{param}.instructions")
    pause = optional(item, "pause_after_compaction", "boolean", f"{param}.pause_after_compaction")
    return Compact(trigger=trigger, instructions=instructions, pause_after=bool(pause))


_DECODERS = {CLEAR_TOOL_USES: _clear_tool_uses, CLEAR_THINKING: _clear_thinking, COMPACT: _compact}


def _amount(raw: object, param: str, units: tuple[str, ...], *, minimum: int) -> tuple[str, int]:
    """`{"type": unit, "value": n}` with `unit` one of `units` and n ≥ `minimum`."""
    amount = check_type(raw, "object", param)
    unit = amount.get("type")
    if unit not in units:
        raise InvalidRequest(f"`{param}.type` must be {' or '.join(repr(u) for u in units)}; got {unit!r}",
                             param=f"{param}.type")
    if amount.get("value") is None:
        raise InvalidRequest(f"missing required parameter `{param}.value`", param=f"{param}.value")
    value = check_type(amount["value"], "integer", f"{param}.value")
    if value < minimum:
        raise InvalidRequest(f"`{param}.value` must be at least {minimum}, got {value}", param=f"{param}.value")
    return unit, value


def _names(raw: list, param: str) -> frozenset[str]:
    return frozenset(check_type(name, "string", f"{param}[{j}]") for j, name in enumerate(raw))
