"""A multi-turn tool conversation in each dialect, through each API (Chat Completions, Anthropic Messages,
Responses chained by previous_response_id; the official SDKs over real HTTP to an in-process engine), where each
turn's prompt tokens extend the previous turn's prompt + output tokens.

The model is a tiny random-weight one, so its output is scripted (`scripted_steps`, at the engine seam): each
turn it emits the canonical tokens of what the dialect renders for the assistant turn (reasoning, text, calls, end of turn). The
fence stays on and must allow every scripted token; the parser turns them into API tool calls; the client
echoes the assistant message back as the SDK returned it; the next prompt must start with prompt + output,
which the prefix cache proves: `cached_tokens == previous prompt + previous completion - 1` (the cache holds
every token that was fed forward: all but the last sampled one, the end-of-turn token).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import anthropic
import openai
import pytest

from tests.support.backends import BACKENDS, load_tiny, scripted_steps
from tests.support.deepseek_models import tiny_deepseek_dir
from tests.support.glm_models import tiny_glm_dir
from tests.support.harmony_models import tiny_harmony_dir
from tests.support.http_server import ThreadedServer
from tests.support.tiny_models import tiny_qwen_dir
from zllm.api import create_app
from zllm.canonical import ChatRequest, FunctionTool, Message, ToolCall
from zllm.engine.torch.loader import load_model
from zllm.runtime.client import LocalEngineClient
from zllm.store import ResponseStore

MODEL = "tiny"
WEATHER = FunctionTool("get_weather", "Weather for a city", {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["paris", "rome"]}, "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False})
CHAT_TOOLS = [{"type": "function", "function": {"name": WEATHER.name, "description": WEATHER.description,
                                                 "parameters": WEATHER.parameters}}]
ANTHROPIC_TOOLS = [{"name": WEATHER.name, "description": WEATHER.description, "input_schema": WEATHER.parameters}]
RESPONSES_TOOLS = [{"type": "function", "name": WEATHER.name, "description": WEATHER.description,
                    "parameters": WEATHER.parameters}]


@dataclass(frozen=True)
class Case:
    name: str
    model_dir: object  # callable → Path
    dialect: str
    thinking: bool
    gguf_spec: str | None = None  # the same tiny model as a GGUF, so the case runs on llama.cpp too


CASES = [
    Case("hermes", tiny_qwen_dir, "hermes", False, "qwen3"),
    Case("qwen3-thinking", tiny_qwen_dir, "qwen3", True, "qwen3"),
    Case("glm45", tiny_glm_dir, "glm45", False),
    Case("deepseek-v3.2-thinking", tiny_deepseek_dir, "deepseek-v3.2", True),
    Case("harmony", tiny_harmony_dir, "harmony", True),
]
PARAMS = [pytest.param((case, "torch"), id=case.name) for case in CASES] + [
    pytest.param((case, "llamacpp"), id=f"{case.name}-llamacpp", marks=BACKENDS[1].marks)
    for case in CASES if case.gguf_spec]


@pytest.fixture(params=PARAMS)
def served(request, tmp_path):
    case, backend = request.param
    loaded = (load_model(case.model_dir(), device="cpu", dtype="float32", threads=1) if backend == "torch"
              else load_tiny(case.gguf_spec, backend))
    engine = LocalEngineClient(loaded, MODEL, 0, dialect=case.dialect, owns_engine=True)
    assert engine.dialect.name == case.dialect
    with ThreadedServer(create_app(engine, responses=ResponseStore(tmp_path / "responses.sqlite3"))) as server:
        yield case, engine, server.url
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
    if engine.dialect.name == "harmony" and follow is None:  # an answer drops its turn's earlier analysis
        from zllm.dialects.harmony.render import answer_output

        full = prefix + answer_output(reply)
    assert full.startswith(prefix), "the generation prompt must be a prefix of the rendered reply"
    ids = engine.loaded.tokenizer.encode(full[len(prefix):], add_special_tokens=False)
    end = next((i for i, token in enumerate(ids) if token in engine.stop_token_ids), None)
    return ids[:end + 1] if end is not None else [*ids, min(engine.stop_token_ids)]


@dataclass
class Turn:
    """What one API turn reports, read back the way a client reads it."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reply: Message  # the assistant message as the client would echo it (calls, text, reasoning)
    finish: str


class ChatApi:
    name = "chat"

    def __init__(self, base_url: str):
        self.sdk = openai.OpenAI(base_url=f"{base_url}/v1", api_key="k", max_retries=0, timeout=60)
        self.messages: list[dict] = []

    def turn(self, history: tuple[Message, ...], thinking: bool, max_tokens: int) -> Turn:
        completion = self.sdk.chat.completions.create(
            model=MODEL, messages=chat_messages(history), tools=CHAT_TOOLS, temperature=0, max_tokens=max_tokens,
            extra_body={"reasoning_effort": "high" if thinking else "none"})
        usage, message = completion.usage, completion.choices[0].message
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or ())
        reasoning = (message.model_extra or {}).get("reasoning_content") or None
        reply = Message("assistant", message.content or "", tool_calls=calls, reasoning=reasoning)
        return Turn(usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens, reply,
                    completion.choices[0].finish_reason)


class AnthropicApi:
    """Echoes the assistant's content blocks back exactly as the SDK returned them (signed thinking included)."""

    name = "anthropic"

    def __init__(self, base_url: str):
        self.sdk = anthropic.Anthropic(base_url=base_url, api_key="k", max_retries=0, timeout=60)
        self.messages: list[dict] = []

    def turn(self, history: tuple[Message, ...], thinking: bool, max_tokens: int) -> Turn:
        self._catch_up(history)
        message = self.sdk.messages.create(
            model=MODEL, system=history[0].content, messages=self.messages, tools=ANTHROPIC_TOOLS,
            max_tokens=max_tokens, extra_body={"temperature": 0},  # this SDK version has no `temperature` argument
            thinking={"type": "enabled", "budget_tokens": 1024} if thinking else {"type": "disabled"})
        self.messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]})
        blocks = {kind: [b for b in message.content if b.type == kind] for kind in ("text", "thinking", "tool_use")}
        reply = Message("assistant", "".join(b.text for b in blocks["text"]),
                        tool_calls=tuple(ToolCall(b.id, b.name, json.dumps(b.input)) for b in blocks["tool_use"]),
                        reasoning="".join(b.thinking for b in blocks["thinking"]) or None)
        usage = message.usage
        prompt = usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
        return Turn(prompt, usage.output_tokens, usage.cache_read_input_tokens or 0, reply, message.stop_reason)

    def _catch_up(self, history: tuple[Message, ...]) -> None:
        """Append the turns after the last assistant reply (the user question, tool results) in wire form."""
        pending = [m for m in history[1:]][len([m for m in self.messages if m["role"] == "assistant"]) * 2:]
        for m in pending:
            if m.role == "user":
                self.messages.append({"role": "user", "content": m.content})
            elif m.role == "tool":
                call_id = self.messages[-1]["content"][-1]["id"]  # the tool_use block just answered
                self.messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call_id, "content": m.content}]})


class ResponsesApi:
    """Chains turns with previous_response_id: the server keeps the history, reasoning items included."""

    name = "responses"

    def __init__(self, base_url: str):
        self.sdk = openai.OpenAI(base_url=f"{base_url}/v1", api_key="k", max_retries=0, timeout=60)
        self.previous = None

    def turn(self, history: tuple[Message, ...], thinking: bool, max_tokens: int) -> Turn:
        if self.previous is None:
            new_input = [{"role": "user", "content": history[1].content}]
        else:
            call = next(item for item in self.previous.output if item.type == "function_call")
            new_input = [{"type": "function_call_output", "call_id": call.call_id, "output": history[-1].content}]
        response = self.sdk.responses.create(
            model=MODEL, instructions=history[0].content, input=new_input, tools=RESPONSES_TOOLS, temperature=0,
            max_output_tokens=max_tokens, previous_response_id=self.previous.id if self.previous else None,
            reasoning={"effort": "high" if thinking else "none"})
        self.previous = response
        items = {kind: [i for i in response.output if i.type == kind] for kind in ("message", "reasoning", "function_call")}
        text = "".join(part.text for item in items["message"] for part in item.content if part.type == "output_text")
        reasoning = "".join(part.text for item in items["reasoning"] for part in item.summary)  # zllm: as a summary
        reply = Message("assistant", text, reasoning=reasoning or None, tool_calls=tuple(
            ToolCall(i.call_id, i.name, i.arguments) for i in items["function_call"]))
        usage = response.usage
        finish = "tool_calls" if items["function_call"] else response.status
        return Turn(usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens, reply, finish)


def chat_messages(messages: tuple[Message, ...]) -> list[dict]:
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


@pytest.mark.parametrize("api_class", [ChatApi, AnthropicApi, ResponsesApi], ids=lambda c: c.name)
def test_each_turn_extends_the_previous_prompt_and_output(served, api_class) -> None:
    case, engine, base_url = served
    api = api_class(base_url)
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
        with scripted_steps(engine, script):
            turn = api.turn(history, case.thinking, max_tokens=len(script) + 8)
        assert turn.completion_tokens == len(script), "the fence let every scripted token through"
        got = turn.reply
        assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == [
            (c.name, json.loads(c.arguments)) for c in reply.tool_calls]
        assert got.content == reply.content and (got.reasoning or None) == reply.reasoning
        assert turn.finish in (("tool_calls", "tool_use") if reply.tool_calls else ("stop", "end_turn", "completed"))
        if previous is not None:
            assert turn.cached_tokens == previous.prompt_tokens + previous.completion_tokens - 1, (
                "this turn's prompt must start with the previous prompt + output")
        previous = turn
        history = (*history, got) + ((follow,) if follow is not None else ())
