"""DeepSeek DSML: the literals and the value rules shared by the renderer, the parser and the fence grammar.

A DSML call block as DeepSeek V3.2 writes it (V4 names the block `tool_calls` instead of `function_calls`):

    \\n\\n<｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="location" string="true">San Francisco</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

Parameters are one per line; a call without parameters is `...name="f">\\n\\n</｜DSML｜invoke>`. A string value
is written raw (no quotes, no escaping) with `string="true"`; any other value as JSON with `string="false"`.
The block always follows the turn's content after a blank line (`\\n\\n`), even when the content is empty.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DSML = "｜DSML｜"
# a slip seen in practice: the marker written with ASCII bars; the parser accepts it, nothing writes it
DSML_ASCII = "|DSML|"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
# the blank line that separates a turn's content from its call block
BLOCK_SEPARATOR = "\n\n"
BLOCK_NAMES = ("function_calls", "tool_calls")


@dataclass(frozen=True)
class DsmlTags:
    """The tag literals of one block name, spelled with one marker (fullwidth, or the ASCII slip)."""

    block: str
    marker: str = DSML

    @property
    def block_open(self) -> str:
        return f"<{self.marker}{self.block}>"

    @property
    def block_close(self) -> str:
        return f"</{self.marker}{self.block}>"

    @property
    def invoke_open(self) -> str:
        """Prefix of the invoke tag; the name and `">` follow."""
        return f'<{self.marker}invoke name="'

    @property
    def invoke_close(self) -> str:
        return f"</{self.marker}invoke>"

    @property
    def param_open(self) -> str:
        """Prefix of the parameter tag; `NAME" string="true|false">` follows."""
        return f'<{self.marker}parameter name="'

    @property
    def param_close(self) -> str:
        return f"</{self.marker}parameter>"


def invoke_tag(tags: DsmlTags, name: str) -> str:
    return f'{tags.invoke_open}{name}">'


def param_tag(tags: DsmlTags, name: str, is_string: bool) -> str:
    return f'{tags.param_open}{name}" string="{"true" if is_string else "false"}">'


def to_json(value: Any) -> str:
    """JSON as DeepSeek writes it in prompts: default separators, non-ASCII kept (= canonical_arguments')."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def argument_items(arguments: str) -> list[tuple[str, Any]]:
    """The (name, value) pairs of a call's JSON arguments, in order. Text that is not a JSON object becomes one
    string parameter `arguments` holding it (a malformed call is echoed rather than refused)."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return [("arguments", arguments)]
    return list(parsed.items())


def render_parameter(tags: DsmlTags, name: str, value: Any) -> str:
    is_string = isinstance(value, str)
    text = value if is_string else to_json(value)
    return f"{param_tag(tags, name, is_string)}{text}{tags.param_close}"


def render_invoke(tags: DsmlTags, name: str, arguments: str) -> str:
    params = "\n".join(render_parameter(tags, key, value) for key, value in argument_items(arguments))
    return f"{invoke_tag(tags, name)}\n{params}\n{tags.invoke_close}"


def render_block(tags: DsmlTags, calls: list[tuple[str, str]]) -> str:
    """`calls` as (name, arguments JSON); the block without its leading separator."""
    invokes = "\n".join(render_invoke(tags, name, arguments) for name, arguments in calls)
    return f"{tags.block_open}\n{invokes}\n{tags.block_close}"


def schema_says_string(schema: dict | None) -> bool | None:
    """True when a parameter schema admits only strings, False when it admits no string, None when unsure."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if kind == "string":
        return True
    if isinstance(kind, str):
        return False
    if isinstance(kind, list):
        return True if set(kind) == {"string"} else None if "string" in kind else False
    for key in ("enum", "const"):
        if key in schema:
            values = schema[key] if key == "enum" else [schema[key]]
            if values and all(isinstance(v, str) for v in values):
                return True
    return None


def decode_value(raw: str, string_attr: bool | None, schema: dict | None) -> Any:
    """A parameter's value from its raw text: the `string` attribute decides; without one the schema does;
    text that should be JSON but is not stays a string (nothing the model wrote is dropped)."""
    is_string = string_attr if string_attr is not None else schema_says_string(schema)
    if is_string:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def argument_fragment(first: bool, name: str, value: Any) -> str:
    """The piece of canonical arguments JSON one parameter adds: `{"k": v` first, `, "k": v` after."""
    return ("{" if first else ", ") + to_json(name) + ": " + to_json(value)
