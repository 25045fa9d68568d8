"""What the fenced tool-calling tests share: the test tools, a validity check of a call's arguments against them,
and the tiny RANDOM-weight model of each dialect (`CASES`) they are called through.

- `WEATHER`, `SEARCH` (`TOOLS`, `TOOLS_BY_NAME`): one schema with an enum, integer bounds and a boolean, one
  with a maxLength.
- `valid(tool, arguments)`: whether `arguments` (JSON text) satisfy the tool's schema.
- `run(coro)`: an engine client coroutine, to its end (at most two minutes).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest

from tests.support.deepseek_models import tiny_deepseek_dir
from tests.support.glm_models import tiny_glm_dir
from tests.support.harmony_models import tiny_harmony_dir
from tests.support.tiny_models import tiny_qwen_dir
from zllm.canonical import FunctionTool

WEATHER = FunctionTool("get_weather", "Weather for a city", {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["paris", "rome", "new york"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 9},
                   "metric": {"type": "boolean"}},
    "required": ["city", "days"], "additionalProperties": False})
SEARCH = FunctionTool("search", "Search the web", {
    "type": "object", "properties": {"query": {"type": "string", "maxLength": 12}},
    "required": ["query"], "additionalProperties": False})
TOOLS = (WEATHER, SEARCH)
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}


@dataclass(frozen=True)
class Case:
    name: str
    model_dir: object
    dialect: str
    trigger: str  # the text that opens a call in this dialect
    # the output that opens a call as the dialect's fence spells it, from the first token (a test that needs
    # calls to happen under `auto` makes a random model write it: tests/support/step_tap.forced_opening)
    opening: str
    gguf_spec: str | None = None  # the same model as a tiny GGUF (tests/support/tiny_gguf.py), for llama.cpp runs
    # seeds in a default run, where a case's seeds are slow (ZLLM_FENCE_SEEDS set: that many for every case)
    default_seeds: int = 100


CASES = [
    Case("hermes", tiny_qwen_dir, "hermes", "<tool_call>", "<tool_call>", gguf_spec="qwen3"),
    Case("glm45", tiny_glm_dir, "glm45", "<tool_call>", "\n<tool_call>"),
    Case("deepseek-v3.2", tiny_deepseek_dir, "deepseek-v3.2", "DSML｜function_calls>", "\n\n<｜DSML｜function_calls>\n"),
    # gpt-oss over the o200k_harmony stand-in: the template's call header, recipient first
    # (its 201K-token vocabulary makes each seed ~10x a Qwen seed: 100/100 seen with ZLLM_FENCE_SEEDS=100, 20 in CI)
    Case("harmony", tiny_harmony_dir, "harmony", "to=functions.", " to=functions.", default_seeds=20),
]


def valid(tool: FunctionTool, arguments: str) -> bool:
    """The subset of JSON Schema the test tools use: types, enum, bounds, maxLength, required, no extras."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return False
    schema = tool.parameters
    if not isinstance(args, dict) or set(args) - set(schema["properties"]) or set(schema["required"]) - set(args):
        return False
    for key, value in args.items():
        rule = schema["properties"][key]
        ok = {"string": isinstance(value, str), "integer": type(value) is int,
              "boolean": type(value) is bool}[rule["type"]]
        ok = ok and value in rule.get("enum", [value]) and len(str(value)) <= rule.get("maxLength", 10 ** 6)
        if rule["type"] == "integer":
            ok = ok and rule.get("minimum", value) <= value <= rule.get("maximum", value)
        if not ok:
            return False
    return True


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def backend_cases() -> list:
    """Every case on torch, and those llama.cpp can run (a tiny GGUF exists) on llamacpp too, as fixture params
    `(case, backend)`."""
    from tests.support.backends import BACKENDS

    llamacpp = BACKENDS[1]
    params = [pytest.param((case, "torch"), id=case.name) for case in CASES]
    params += [pytest.param((case, "llamacpp"), id=f"{case.name}-llamacpp", marks=llamacpp.marks)
               for case in CASES if case.gguf_spec]
    return params


def load_case(case: Case, backend: str):
    """The case's tiny model on `backend` (CPU, float32, one thread)."""
    from tests.support.backends import load_tiny
    from zllm.engine.torch.loader import load_model

    if backend == "torch":
        return load_model(case.model_dir(), device="cpu", dtype="float32", threads=1)
    return load_tiny(case.gguf_spec, backend)
