"""Hermes / Qwen: the literals the renderer, the parser and the fence grammar share.

    <think>\\n{reasoning}\\n</think>\\n\\n                       (qwen3 only)
    {text}\\n<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>
"""

from __future__ import annotations

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# slips the parser tolerates (the fence never writes them): the call tags in upper case
CALL_OPENERS = (CALL_OPEN, CALL_OPEN.upper())
CALL_CLOSERS = (CALL_CLOSE, CALL_CLOSE.upper())
