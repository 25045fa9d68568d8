"""The derived fence on the llama.cpp backend (test_fenced_derived.py runs it on torch): the tiny RANDOM-weight Qwen3
as an F32 GGUF (tests/support/backends.tiny_gguf_model_dir) with Qwen3-Coder's template in its model directory —
where a pull of a GGUF writes the template its `tokenizer.chat_template` carries (models/sources/gguf_import.py;
the llama.cpp backend renders with it) — chosen by the registry from the template ("auto"), through the engine
client's real decode path on llama.cpp:

- `required` / a named tool: every seed's first call is fenced, valid, in the template's per-parameter tags;
- `auto`: calls that start are valid and `none` never calls (test_fenced_generation's checks), free text is
  free until the opener (a forced text opening is kept, then a forced opener still gives a valid call);
- a bare JSON call (dialects/bare_json.py) made to open the turn completes valid, and the next turn's prompt
  continues this turn's prompt + output.

One model, loaded once for the module. 6 seeds a case by default (ZLLM_FENCE_SEEDS sets it)."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tests.integration.test_fenced_generation import (  # noqa: F401  (collected here with this module's engine)
    calls_of,
    test_auto_calls_that_start_are_valid_and_none_never_calls,
    test_forced_calls_are_valid_for_every_seed,
)
from tests.support.backends import BACKENDS, tiny_gguf_model_dir
from tests.support.fenced_tools import TOOLS, TOOLS_BY_NAME, Case, run, valid
from tests.support.step_tap import StepTap, opened
from tests.support.tiny_gguf import GGUF_RECIPE_VERSION
from tests.support.tiny_models import _cached
from zllm.canonical import ChatRequest, Message, SamplingParams, ToolCall, ToolCallEnd, ToolCallStart, ToolChoice
from zllm.runtime.client import LocalEngineClient

pytestmark = list(BACKENDS[1].marks)
SEEDS = 6
TEMPLATE = "Qwen3-Coder"


def gguf_dir_with_template(stem: str) -> Path:
    """tiny-gguf-dir-qwen3 with llama.cpp's `stem` template as its chat template (files hard-linked)."""
    def build(out: Path) -> None:
        from tests.support.llama_templates import TemplatesUnavailable, template_dir

        try:
            source = (template_dir() / f"{stem}.jinja").read_text()
        except TemplatesUnavailable as exc:
            pytest.skip(str(exc))
        for path in tiny_gguf_model_dir("qwen3").iterdir():
            if path.name != "chat_template.jinja":
                try:
                    os.link(path, out / path.name)
                except OSError:
                    shutil.copy(path, out / path.name)
        (out / "chat_template.jinja").write_text(source)

    return _cached(f"tiny-gguf-derived-{stem}-v{GGUF_RECIPE_VERSION}", build)


CASE = Case("qwen3-coder-llamacpp", lambda: gguf_dir_with_template(TEMPLATE), "auto", "<tool_call>",
            "<tool_call>\n<function=", default_seeds=SEEDS)


@pytest.fixture(scope="module")
def engine():
    from zllm.engine.select import load_for_backend

    loaded = replace(load_for_backend(CASE.model_dir(), backend="llamacpp", device="cpu", dtype="float32",
                                      threads=1), threads=1)
    assert loaded.backend == "llamacpp", loaded.backend
    client = LocalEngineClient(loaded, "m", 0, dialect=CASE.dialect, prefix_cache=False)
    assert client.dialect.name == "derived" and client.dialect.format.tagged, client.dialect.name
    client.tap = StepTap(client)
    yield CASE, client
    client.tap.remove()
    client.close()
    loaded.close()


@pytest.mark.timeout(600)
def test_auto_text_is_free_until_the_opener(engine) -> None:
    """Under `auto` free text goes through as the model writes it (a forced text opening is not bent), and an
    opener after it (the template's "\n\n" between text and calls, then `<tool_call>`) still gives a fenced,
    valid call."""
    _, client = engine
    text = "Sure, the weather."
    for seed in range(SEEDS):
        result = calls_of(client, ToolChoice("auto"), seed, first_only=False, max_tokens=12, opening=text)
        assert result.text.startswith(text) and not result.calls, f"seed {seed}: {result}"
        result = calls_of(client, ToolChoice("auto"), seed, first_only=True, max_tokens=200,
                          opening=text + client.dialect.format.content_sep + CASE.opening)
        assert result.text == text and result.calls, f"seed {seed}: {result}"
        assert all(valid(TOOLS_BY_NAME[name], arguments) for name, arguments in result.calls), f"seed {seed}"


BARE_OPENING = '{"name": "search", "'


@pytest.mark.timeout(600)
def test_a_bare_call_completes_valid_and_the_next_turn_continues_it(engine) -> None:
    _, client = engine
    for seed in range(SEEDS):
        first = ChatRequest(id=f"b{seed}", model="m", messages=(Message("user", "Find the weather."),), tools=TOOLS,
                            tool_choice=ToolChoice("auto"), thinking=False,
                            sampling=SamplingParams(temperature=1.0, seed=seed, max_tokens=120))
        with opened(client.tap, client, first, BARE_OPENING):
            events = run(_collect(client, first))
        starts = [e for e in events if isinstance(e, ToolCallStart)]
        ends = [e for e in events if isinstance(e, ToolCallEnd)]
        assert len(starts) == len(ends) == 1 and starts[0].name == "search", f"seed {seed}: {events}"
        assert valid(TOOLS_BY_NAME["search"], ends[0].arguments), f"seed {seed}: {ends[0]}"
        key = {"bja": "arguments", "bjp": "parameters"}[starts[0].id.rpartition("-")[2]]
        output = BARE_OPENING + key + '": ' + ends[0].arguments + "}"
        call = ToolCall(starts[0].id, "search", ends[0].arguments)
        second = replace(first, messages=(*first.messages, Message("assistant", "", tool_calls=(call,)),
                                          Message("tool", "sunny", tool_call_id=call.id)))
        before, after = (client.renderer.render(r).text for r in (first, second))
        assert after.startswith(before + output), f"seed {seed}: the next prompt forks from {before + output!r}"


async def _collect(client: LocalEngineClient, request: ChatRequest) -> list:
    return [event async for event in await client.submit(request)]
