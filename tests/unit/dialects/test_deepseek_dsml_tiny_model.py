"""The tiny random DeepSeek-V3 model over the V3.1 vocabulary: it loads through the engine's loader, generates,
and a scripted DSML call goes prompt → model → text → events."""

from __future__ import annotations

import pytest
import torch

from tests.support.deepseek_models import tiny_deepseek_dir
from tests.support.dialect_harness import counter, parse_all
from tests.support.tiny_models import scripted_output
from zllm.canonical import (
    FunctionTool,
    Message,
    ReasoningDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from zllm.dialects.base import Conversation
from zllm.dialects.dsml.dialect import DeepSeekV32Dsml
from zllm.engine.torch.loader import load_model

WEATHER = FunctionTool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}})


@pytest.fixture(scope="module")
def loaded():
    return load_model(tiny_deepseek_dir(), device="cpu", dtype="float32", threads=1)


def prompt_ids(loaded) -> torch.Tensor:
    text = DeepSeekV32Dsml().render(Conversation((Message("user", "Weather in Paris?"),), (WEATHER,), thinking=True),
                                    None)
    return torch.tensor([loaded.tokenizer.encode(text, add_special_tokens=False)])


def test_loads_as_deepseek_v3_and_generates(loaded) -> None:
    assert type(loaded.model).__name__ == "DeepseekV3ForCausalLM"
    assert loaded.tokenizer.eos_token == "<｜end▁of▁sentence｜>"
    ids = prompt_ids(loaded)
    assert ids[0, 0].item() == 0 and ids[0, -2:].tolist() == [128804, 128798]  # BOS … <｜Assistant｜><think>
    out = loaded.model.generate(ids, max_new_tokens=8, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    assert len(new) == 8 and loaded.tokenizer.eos_token_id not in new


def test_a_scripted_call_parses_back(loaded) -> None:
    tokenizer = loaded.tokenizer
    answer = ('Paris weather.</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
              '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
              '</｜DSML｜function_calls>')
    script = [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]
    ids = prompt_ids(loaded)
    with scripted_output(loaded.model, script):
        out = loaded.model.generate(ids, max_new_tokens=len(script), do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    assert new == script
    pieces = [tokenizer.decode([token]) for token in new[:-1]]  # EOS ends the stream, it is not text
    events = parse_all(lambda: DeepSeekV32Dsml().parser((WEATHER,), thinking=True, new_call_id=counter()), pieces)
    assert events == [ReasoningDelta("Paris weather."), ToolCallStart(0, "call_0", "get_weather"),
                      ToolCallArgsDelta(0, '{"city": "Paris"}'), ToolCallEnd(0, '{"city": "Paris"}')]
