"""Raw (unquoted) string values under a JSON Schema's string constraints, as llguidance Lark terminal text.

GLM's `<arg_value>` and DeepSeek's `string="true"` parameters carry strings raw, not as JSON, so the `%json`
sub-grammar that enforces `minLength` / `maxLength` / `pattern` for JSON dialects does not apply; this builds
the equivalent terminal for the raw text:

    {"type": "string", "maxLength": 12}              → /(?s:.{0,12})/
    {"type": "string", "pattern": "^[a-z]+$"}        → /(?:[a-z]+)/
    {"type": "string", "minLength": 1, "pattern": "x"} → /(?s:.{1,})/ & /(?s:.*)(?:x)(?s:.*)/

JSON Schema patterns are unanchored searches; a pattern anchored at both ends is used as a whole match. The
caller intersects the result with its own "no markup inside" terminal.
"""

from __future__ import annotations


def raw_string_terminal(schema: dict | None) -> str | None:
    """The Lark terminal expression for a raw string value of `schema`, or None when it is unconstrained."""
    if not isinstance(schema, dict):
        return None
    parts = []
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(low, int) or isinstance(high, int):
        parts.append(f"/(?s:.{{{max(low or 0, 0)},{high if isinstance(high, int) else ''}}})/")
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and pattern:
        parts.append(f"/{escape_slashes(_as_full_match(pattern))}/")
    return " & ".join(parts) or None


def min_length(schema: dict | None) -> int:
    value = schema.get("minLength") if isinstance(schema, dict) else None
    return value if isinstance(value, int) and value > 0 else 0


def _as_full_match(pattern: str) -> str:
    if pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$"):
        return f"(?:{pattern[1:-1]})"
    start = "" if pattern.startswith("^") else "(?s:.*)"
    end = "" if pattern.endswith("$") and not pattern.endswith("\\$") else "(?s:.*)"
    return f"{start}(?:{pattern.lstrip('^').removesuffix('$') if end == '' else pattern.lstrip('^')}){end}"


def escape_slashes(regex: str) -> str:
    """`regex` made safe inside Lark's /.../: unescaped slashes escaped."""
    out, escaped = [], False
    for char in regex:
        out.append("\\/" if char == "/" and not escaped else char)
        escaped = char == "\\" and not escaped
    return "".join(out)
