"""How each API shows a tool call's id: the core owns the id, an encoder only spells it.

The core mints one id per call as the dialect parser opens it (`call_<24 hex>`: zllm/ids.py, passed to the
parser by runtime/client.py) and it travels on `ToolCallStart.id`. Every encoder shows that same id in its
protocol's form, so one call has one id in the trace, on every API and in the next turn's history:

    Chat / Ollama `id`, Responses `call_id`   call_<hex>    (the core's id as it is)
    Anthropic tool_use `id`                   toolu_<hex>   (the same hex, Anthropic's prefix)

The core minting was kept, rather than moved into the encoders, because the dialect contract already
carries the id from the parser to every API; moving it would change every dialect's parser for nothing.
"""

from __future__ import annotations

OPENAI = "call"       # Chat `tool_calls[].id`, Responses `call_id`, Ollama `tool_calls[].id`
ANTHROPIC = "toolu"   # Anthropic `tool_use.id`


def shown_call_id(core_id: str, prefix: str) -> str:
    """`core_id` spelled `<prefix>_<its unique part>`: the part after the core's own prefix, or the whole id
    when it has none (an engine that mints bare ids)."""
    _, separator, unique = core_id.partition("_")
    return f"{prefix}_{unique if separator else core_id}"
