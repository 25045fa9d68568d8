"""Two canonical requests that should have shared a prefix: what differs between them, as a `Diagnosis`.

Used when both requests are known (`explain-miss --between A.json B.json`): the segment the token streams
diverge in says where to look, and the canonical forms say what changed there, more surely than decoded
windows can:

    tools      same names in another order → reordered tools; names added/dropped → tools added or removed;
               a tool's description or parameters changed → changed tool schema (or a timestamp, whitespace…
               inside its description); equal schemas whose JSON keys come in another order → JSON
               serialization (templates serialize schemas with `tojson`, keeping the client's key order)
    messages   role / text / tool calls / ids / reasoning of the first differing message; text differences go
               through the same clues as daemon windows (causes.py), on whole strings
"""

from __future__ import annotations

import json

from zllm.canonical import ChatRequest, FunctionTool, Message, ToolCall
from zllm.diagnosis.causes import Cause, Diagnosis, diagnose_text
from zllm.diagnosis.segments import Label, message_name, tool_name


def diagnose_requests(a: ChatRequest, b: ChatRequest, label: Label | None) -> Diagnosis | None:
    """What changed from `a` (cached) to `b` (request), looking first where the divergence is (`label`)."""
    if same_prompt_input(a, b):
        return Diagnosis(Cause.TEMPLATE_CHANGE, "both are the same canonical request: the chat template or "
                                                "renderer turned it into different tokens")
    start = label.index if label and label.kind in ("system", "message", "messages") else 0
    in_tools = label is not None and label.kind in ("tools", "tool")
    tool_index = label.index if label and label.kind == "tool" else None
    if in_tools:
        return diagnose_tools(a.tools, b.tools, tool_index) or diagnose_messages(a.messages, b.messages, 0)
    return diagnose_messages(a.messages, b.messages, start or 0) or diagnose_tools(a.tools, b.tools, None)


def same_prompt_input(a: ChatRequest, b: ChatRequest) -> bool:
    """Everything the renderer reads is equal, JSON spelling of tool schemas included."""
    return (a.messages == b.messages and a.tools == b.tools and a.thinking == b.thinking
            and [_dumps(t.parameters) for t in a.tools] == [_dumps(t.parameters) for t in b.tools])


def diagnose_tools(old: tuple[FunctionTool, ...], new: tuple[FunctionTool, ...],
                   index: int | None) -> Diagnosis | None:
    old_names, new_names = [t.name for t in old], [t.name for t in new]
    if old_names != new_names:
        return tool_list_change(old_names, new_names)
    order = ([index] if index is not None and index < len(new) else []) + list(range(len(new)))
    for i in order:
        if old[i] != new[i] or _dumps(old[i].parameters) != _dumps(new[i].parameters):
            return _tool_change(tool_name(i, new[i]), old[i], new[i])
    return None


def diagnose_messages(old: tuple[Message, ...], new: tuple[Message, ...], start: int) -> Diagnosis | None:
    for k in range(start, max(len(old), len(new))):
        if k >= len(old):
            where = message_name(k, new[k], first=k == 0)
            return Diagnosis(Cause.TEMPLATE_CHANGE,
                             f"the cached request ended before {where}; the template renders the turn it "
                             "was generated under differently from that turn as history (it adds or strips "
                             "something there, e.g. reasoning)")
        if k >= len(new):
            return Diagnosis(Cause.EDITED_HISTORY, f"the request drops the cached conversation's messages from "
                                                   f"{k} on, and the template renders its end differently")
        if old[k] != new[k]:
            return _message_change(message_name(k, new[k], first=k == 0), old[k], new[k])
    return None


def tool_list_change(old_names: list[str], new_names: list[str]) -> Diagnosis:
    """Two tool lists by name (they differ): reordered, or tools added and removed."""
    if sorted(old_names) == sorted(new_names):
        i = next(i for i, (x, y) in enumerate(zip(old_names, new_names)) if x != y)
        return Diagnosis(Cause.REORDERED_TOOLS, f"the same {len(new_names)} tools come in a different order: "
                                                f"tool {i} is {new_names[i]} (was {old_names[i]}); "
                                                "send tools in a stable order")
    added = [n for n in new_names if n not in old_names]
    removed = [n for n in old_names if n not in new_names]
    parts = ([f"added {', '.join(added)}"] if added else []) + ([f"removed {', '.join(removed)}"] if removed else [])
    if not parts:  # same set, a name repeated differently: cannot happen for valid requests, still say something
        parts = [f"{old_names} became {new_names}"]
    return Diagnosis(Cause.TOOLS_ADDED_OR_REMOVED, "the tool list changed: " + "; ".join(parts))


def _tool_change(where: str, old: FunctionTool, new: FunctionTool) -> Diagnosis:
    if old.description != new.description:
        return diagnose_text(old.description, new.description, where=f"the description of {where}") or Diagnosis(
            Cause.CHANGED_TOOL_SCHEMA, f"the description of {where} changed")
    if old.parameters != new.parameters:
        path = _first_difference_path(old.parameters, new.parameters)
        return Diagnosis(Cause.CHANGED_TOOL_SCHEMA, f"the parameters of {where} changed at `{path}`")
    if old.grammar != new.grammar:
        return Diagnosis(Cause.CHANGED_TOOL_SCHEMA, f"the input grammar of {where} changed")
    return Diagnosis(Cause.JSON_SERIALIZATION, f"the parameters of {where} are the same JSON schema spelled "
                                               "differently (key order); serialize schemas one way")


def _message_change(where: str, old: Message, new: Message) -> Diagnosis:
    if old.role != new.role:
        return Diagnosis(Cause.EDITED_HISTORY, f"{where} was a {old.role} message in the cached request")
    if old.content != new.content:
        return diagnose_text(old.content, new.content, where=_the(where)) or Diagnosis(
            Cause.EDITED_HISTORY, f"the text of {_the(where)} changed")
    if old.tool_calls != new.tool_calls:
        return _calls_change(where, old.tool_calls, new.tool_calls)
    if (old.tool_call_id, old.name) != (new.tool_call_id, new.name):
        if old.tool_call_id != new.tool_call_id:
            return _stamp(f"the call id {where} answers", old.tool_call_id, new.tool_call_id)
        return Diagnosis(Cause.EDITED_HISTORY, f"the tool name of {where} changed ({old.name} → {new.name})")
    return Diagnosis(Cause.EDITED_HISTORY, f"the reasoning echoed in {where} changed (dropped or edited)")


def _calls_change(where: str, old: tuple[ToolCall, ...], new: tuple[ToolCall, ...]) -> Diagnosis:
    if len(old) != len(new):
        return Diagnosis(Cause.EDITED_HISTORY, f"{where} has {len(new)} tool calls, the cached one {len(old)}")
    for x, y in zip(old, new):
        if x.name != y.name:
            return Diagnosis(Cause.EDITED_HISTORY, f"{where} calls {y.name} where it called {x.name}")
        if x.arguments != y.arguments:
            if _json_value(x.arguments) is not None and _json_value(x.arguments) == _json_value(y.arguments):
                return Diagnosis(Cause.JSON_SERIALIZATION, f"the arguments of the {y.name} call in {where} are the "
                                                           "same JSON spelled differently; echo calls back verbatim")
            return Diagnosis(Cause.EDITED_HISTORY, f"the arguments of the {y.name} call in {where} changed")
        if x.id != y.id:
            return _stamp(f"the id of the {y.name} call in {where}", x.id, y.id)
    return Diagnosis(Cause.EDITED_HISTORY, f"the tool calls of {where} changed")


def _stamp(what: str, old: str | None, new: str | None) -> Diagnosis:
    return Diagnosis(Cause.SESSION_STAMP, f"{what} changed (`{old}` → `{new}`): ids minted afresh each turn "
                                          "defeat the cache")


def _first_difference_path(old: object, new: object, path: str = "") -> str:
    """The dotted path of the first place two JSON values differ ("properties.command.description")."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            if key not in old or key not in new or old[key] != new[key]:
                child = f"{path}.{key}" if path else str(key)
                if key in old and key in new:
                    return _first_difference_path(old[key], new[key], child)
                return child
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (x, y) in enumerate(zip(old, new)):
            if x != y:
                return _first_difference_path(x, y, f"{path}[{i}]")
    return path or "(the whole schema)"


def _json_value(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _the(where: str) -> str:
    return f"the {where}" if where == "system block" else where
