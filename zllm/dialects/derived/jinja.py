"""A chat template's Jinja source as a callable that takes the whole conversation (tools, tool calls, reasoning).

The same environment transformers' `apply_chat_template` renders in (sandboxed, `trim_blocks`, `lstrip_blocks`,
`loopcontrols`, a json.dumps `tojson`, `raise_exception`, `strftime_now`, a no-op `{% generation %}` tag), but
without transformers (dialects import no tokenizer library). The derived dialect renders through it directly,
because the prompt it writes must be the template's own rendering of tools, calls and results.
"""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import SandboxedEnvironment


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant masks in training templates): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=_listed)


def _environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters["fromjson"] = json.loads
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime(2026, 1, 1).strftime(fmt)  # fixed: prompts must repeat
    return env


class JinjaChatTemplate:
    """`template(messages, tools=..., add_generation_prompt=...)` → text; messages in the OpenAI/HF shape
    (`tool_calls` with `function.arguments` as an object, `reasoning_content`)."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self._template = _environment().from_string(source)
        self._specials = {"bos_token": bos_token, "eos_token": eos_token}

    def __call__(self, messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool,
                 **extra) -> str:
        messages = [_aliased(message) for message in messages]
        # `tools=[]` stays an empty list: a template that iterates over its tools unconditionally (Command R+) is given
        # one where a conversation has none (render.py)
        return self._template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                     **self._specials, **extra)


def _aliased(message: dict) -> dict:
    """Reasoning under each name templates read it by (`reasoning_content`, gpt-oss's `thinking`)."""
    reasoning = message.get("reasoning_content")
    return {**message, "thinking": reasoning} if reasoning is not None else message


def _listed(value):
    """What `tools | map(attribute='function') | tojson` hands json: a generator (llama.cpp's own DeepSeek R1
    template), written as the list it yields."""
    if hasattr(value, "__iter__") and not isinstance(value, (str, bytes, dict)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
