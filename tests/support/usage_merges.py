"""The ways clients fold a streamed Anthropic answer's usage: message_start's, then each message_delta's, merged.

    usage = fold(MERGES["claude_code"], frames)    # frames: the SSE data objects, in order
    prompt_counted(usage)                          # input + cache_creation + cache_read

A server's usage is sound when every merge counts the prompt exactly once. The merges:
- claude_code: Claude Code 2.1.197's own (its bundled `Mse(e, t)`): a delta's input field replaces the start's
  only when it is above 0; output_tokens when present. A re-split delta ({input 0, cache_creation N}) counts
  the prompt twice under it: the bug of issue 20.
- sdk: the anthropic SDK's MessageStream accumulate: each delta field that is not None replaces the start's
  (the real SDK runs against a real daemon in tests/integration/test_usage_once.py).
- override: a plain `{**start, **delta}`.
- sum: a client that adds the start and the deltas up (a delta repeating the input counts it twice).
"""

from __future__ import annotations

from collections.abc import Callable

INPUT_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
Merge = Callable[[dict, dict], dict]


def claude_code(start: dict, delta: dict) -> dict:
    def pick(name: str) -> int:
        value = delta.get(name)
        return value if value is not None and value > 0 else start.get(name, 0)

    output = delta.get("output_tokens")
    return {**{name: pick(name) for name in INPUT_FIELDS},
            "output_tokens": output if output is not None else start.get("output_tokens", 0)}


def sdk(start: dict, delta: dict) -> dict:
    return {**start, **{name: value for name, value in delta.items() if value is not None}}


def override(start: dict, delta: dict) -> dict:
    return {**start, **delta}


def summed(start: dict, delta: dict) -> dict:
    names = {*start, *delta}
    return {name: (start.get(name) or 0) + (delta.get(name) or 0) for name in names}


MERGES: dict[str, Merge] = {"claude_code": claude_code, "sdk": sdk, "override": override, "sum": summed}


def fold(merge: Merge, frames: list[dict]) -> dict:
    """The usage a client holds at the end of the stream."""
    [start] = [f["message"]["usage"] for f in frames if f["type"] == "message_start"]
    usage = dict(start)
    for frame in frames:
        if frame["type"] == "message_delta":
            usage = merge(usage, frame["usage"])
    return usage


def prompt_counted(usage: dict) -> int:
    return sum(usage.get(name) or 0 for name in INPUT_FIELDS)
