"""A multi-turn tool conversation in each dialect, through the Chat Completions API (openai SDK, real HTTP,
in-process engine), where each turn's prompt tokens extend the previous turn's prompt + output tokens.

The model is a tiny random-weight one, so its output is scripted (`scripted_output`): each turn it emits the
canonical tokens of what the dialect renders for the assistant turn (reasoning, text, calls, end of turn). The
fence stays on and must allow every scripted token; the parser turns them into API tool calls; the client
echoes the assistant message back as the SDK returned it; the next prompt must start with prompt + output,
which the prefix cache proves: `cached_tokens == previous prompt + previous completion - 1` (the cache holds
every token that was fed forward: all but the last sampled one, the end-of-turn token).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import openai
import pytest

from tests.support.deepseek_models import tiny_deepseek_dir
from tests.support.glm_models import tiny_glm_dir
from tests.support.http_server import ThreadedServer
from tests.support.tiny_models import scripted_output, tiny_qwen_dir
from zllm.api import create_app
from zllm.canonical import ChatRequest, FunctionTool, Message, ToolCall
from zllm.engine.loader import load_model
from zllm.runtime import LocalEngineClient

MODEL = "tiny"
WEATHER = FunctionTool("get_weather", "Weather for a city", {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["paris", "rome"]}, "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False})
TOOLS_WIRE = [{"type": "function", "function": {"name": WEATHER.name, "description": WEATHER.description,
                                                 "parameters": WEATHER.parameters}}]


@dataclass(frozen=True)
class Case:
    name: str
    model_dir: object  # callable → Path
    dialect: str
    thinking: bool


CASES = [
    Case("hermes", tiny_qwen_dir, "hermes", False),
    Case("qwen3-thinking", tiny_qwen_dir, "qwen3", True),
    Case("glm45", tiny_glm_dir, "glm45", False),
    Case("deepseek-v3.2-thinking", tiny_deepseek_dir, "deepseek-v3.2", True),
]


@pytest.fixture(params=CASES, ids=lambda case: case.name)
def served(request):
    case: Case = request.param
    loaded = load_model(case.model_dir(), device="cpu", dtype="float32", threads=1)
    engine = LocalEngineClient(loaded, MODEL, 0, dialect=case.dialect)
    assert engine.dialect.name == case.dialect
    with ThreadedServer(create_app(engine)) as server:
        sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0, timeout=60)
        yield case, engine, sdk
    engine.close()


def script_for(engine: LocalEngineClient, history: tuple[Message, ...], reply: Message, follow: Message | None,
               thinking: bool) -> list[int]:
    """The canonical tokens of `reply` as the dialect renders it after `history`, up to its end of turn (the
    turn that follows decides which end-of-turn token that is; without one, any stop token ends it)."""
    request = ChatRequest(id="s", model=MODEL, messages=history, tools=(WEATHER,), thinking=thinking)
    renderer = engine.renderer
    prefix = renderer.template_text(request, history)
    rendered = (*history, reply) if follow is None else (*history, reply, follow)
    full = renderer.template_text(request, rendered, add_generation_prompt=False)
    assert full.startswith(prefix), "the generation prompt must be a prefix of the rendered reply"
    ids = engine.loaded.tokenizer.encode(full[len(prefix):], add_special_tokens=False)
    end = next((i for i, token in enumerate(ids) if token in engine.stop_token_ids), None)
    return ids[:end + 1] if end is not None else [*ids, min(engine.stop_token_ids)]


def wire_messages(messages: tuple[Message, ...]) -> list[dict]:
    out = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.role == "assistant":
            item = {"role": "assistant", "content": m.content or None}
            if m.tool_calls:
                item["tool_calls"] = [{"id": c.id, "type": "function",
                                       "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
            if m.reasoning:
                item["reasoning_content"] = m.reasoning
            out.append(item)
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def as_message(choice_message) -> Message:
    """The assistant message exactly as a client would echo it back."""
    extra = choice_message.model_extra or {}
    calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in choice_message.tool_calls or ())
    return Message("assistant", choice_message.content or "", tool_calls=calls,
                   reasoning=extra.get("reasoning_content") or None)


def test_each_turn_extends_the_previous_prompt_and_output(served) -> None:
    case, engine, sdk = served
    effort = {"reasoning_effort": "high" if case.thinking else "none"}
    history: tuple[Message, ...] = (Message("system", "You check the weather."),
                                    Message("user", "Weather in Paris, then Rome?"))
    replies = [
        (Message("assistant", "", reasoning="Paris first." if case.thinking else None,
                 tool_calls=(ToolCall("c1", "get_weather", json.dumps({"city": "paris", "days": 2})),)),
         Message("tool", "sunny", tool_call_id="c1", name="get_weather")),
        (Message("assistant", "Now Rome.", reasoning="Then Rome." if case.thinking else None,
                 tool_calls=(ToolCall("c2", "get_weather", json.dumps({"city": "rome", "days": 3})),)),
         Message("tool", "rainy", tool_call_id="c2", name="get_weather")),
        # the last turn: nothing follows it here (a new user turn would drop its reasoning, by design)
        (Message("assistant", "Paris is sunny, Rome is rainy.", reasoning="Done." if case.thinking else None),
         None),
    ]
    previous = None
    for reply, follow in replies:
        script = script_for(engine, history, reply, follow, case.thinking)
        with scripted_output(engine.loaded.model, script):
            completion = sdk.chat.completions.create(
                model=MODEL, messages=wire_messages(history), tools=TOOLS_WIRE, temperature=0,
                max_tokens=len(script) + 8, extra_body=effort)
        usage, message = completion.usage, completion.choices[0].message
        assert usage.completion_tokens == len(script), "the fence let every scripted token through"
        got = as_message(message)
        assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == [
            (c.name, json.loads(c.arguments)) for c in reply.tool_calls]
        assert got.content == reply.content and (got.reasoning or None) == reply.reasoning
        assert completion.choices[0].finish_reason == ("tool_calls" if reply.tool_calls else "stop")
        if previous is not None:
            assert usage.prompt_tokens_details.cached_tokens == previous[0] + previous[1] - 1, (
                "this turn's prompt must start with the previous prompt + output")
        previous = (usage.prompt_tokens, usage.completion_tokens)
        history = (*history, got) + ((follow,) if follow is not None else ())
