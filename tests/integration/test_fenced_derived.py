"""The fenced-generation tests (test_fenced_generation.py) over derived dialects: the tiny RANDOM-weight Qwen model
with a real template swapped in (Qwen3-Coder: per-parameter tags, a boolean written `True`; Mistral Nemo: an id
the model writes, nine letters and digits; Small 3.2's system prompt overflows the tiny model's 512 positions),
chosen by the registry from the template ("auto"), through the engine client's real decode path. 6 seeds a case
by default (ZLLM_FENCE_SEEDS sets it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.integration.test_fenced_generation import (  # noqa: F401  (collected here with this module's engine)
    test_auto_calls_that_start_are_valid_and_none_never_calls,
    test_forced_calls_are_valid_for_every_seed,
)
from tests.support.fenced_tools import Case, run
from tests.support.step_tap import StepTap
from tests.support.tiny_models import _cached, tiny_qwen_dir
from zllm.canonical import ChatRequest, Message, SamplingParams, ToolCallStart, ToolChoice
from zllm.runtime.client import LocalEngineClient

SEEDS = 6


def _with_template(stem: str):
    def build(out: Path) -> None:
        from tests.support.llama_templates import TemplatesUnavailable, template_dir

        try:
            source = (template_dir() / f"{stem}.jinja").read_text()
        except TemplatesUnavailable as exc:
            pytest.skip(str(exc))
        for path in tiny_qwen_dir().iterdir():
            if path.name != "chat_template.jinja":
                try:
                    os.link(path, out / path.name)
                except OSError:
                    shutil.copy(path, out / path.name)
        (out / "chat_template.jinja").write_text(source)

    return lambda: _cached(f"tiny-qwen-derived-{stem}-v1", build)


DERIVED_CASES = [
    Case("qwen3-coder", _with_template("Qwen3-Coder"), "auto", "<tool_call>", "<tool_call>\n<function=",
         default_seeds=SEEDS),
    # `[TOOL_CALLS]` is text in this vocabulary (one special token in Mistral's): the call opens with the whole
    # opener, which is what `none` must never let through
    Case("mistral-nemo", _with_template("mistralai-Mistral-Nemo-Instruct-2407"), "auto", '[TOOL_CALLS][{"name": "',
         '[TOOL_CALLS][{"name": "', default_seeds=SEEDS),
]


@pytest.fixture(scope="module", params=DERIVED_CASES, ids=[case.name for case in DERIVED_CASES])
def engine(request):
    from zllm.engine.torch.loader import load_model

    case = request.param
    loaded = load_model(case.model_dir(), device="cpu", dtype="float32", threads=1)
    client = LocalEngineClient(loaded, "m", 0, dialect=case.dialect, prefix_cache=False)
    assert client.dialect.name == "derived", client.dialect.name
    client.tap = StepTap(client)
    yield case, client
    client.tap.remove()
    client.close()
    loaded.close()


def test_a_written_id_is_the_models_own(engine) -> None:
    """Mistral Nemo: the id in a fenced call is nine letters and digits the model wrote, carried on the call's
    id (derived/ids.py)."""
    from zllm.dialects.derived.ids import written_id

    case, client = engine
    if case.name != "mistral-nemo":
        pytest.skip("the template writes no ids")

    async def first_start():
        request = ChatRequest(id="r", model="m", messages=(Message("user", "Weather?"),), tools=_tools(),
                              tool_choice=ToolChoice("required"), thinking=False,
                              sampling=SamplingParams(temperature=1.0, seed=3, max_tokens=200))
        async for event in await client.submit(request):
            if isinstance(event, ToolCallStart):
                return event

    start = run(first_start())
    assert start is not None and len(written_id(start.id)) == 9 and written_id(start.id).isalnum(), start


def _tools():
    from tests.support.fenced_tools import TOOLS

    return TOOLS
