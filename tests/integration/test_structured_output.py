"""Structured output through the APIs with a tiny random-weight model: the fence alone makes its answer valid
JSON for the schema (then the end of turn is the only token left); a schema llguidance cannot compile is a
400 in the API's own error shape, before anything streams."""

from __future__ import annotations

import json

import openai
import pytest

from tests.support.http_server import ThreadedServer
from tests.support.tiny_models import tiny_qwen_dir
from zllm.api import create_app
from zllm.engine.torch.loader import load_model
from zllm.runtime.client import LocalEngineClient

SCHEMA = {"type": "object",
          "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]},
                         "score": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["verdict", "score"], "additionalProperties": False}


@pytest.fixture(scope="module")
def sdk():
    engine = LocalEngineClient(load_model(tiny_qwen_dir(), device="cpu", dtype="float32", threads=1), "tiny", 0)
    with ThreadedServer(create_app(engine)) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0, timeout=60)
    engine.close()


def conforms(text: str) -> bool:
    value = json.loads(text)
    return set(value) == {"verdict", "score"} and value["verdict"] in ("yes", "no") and 0 <= value["score"] <= 9


@pytest.mark.parametrize("seed", range(5))
def test_chat_json_schema(sdk, seed) -> None:
    completion = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Is it good?"}], temperature=1.0, seed=seed,
        max_tokens=60, response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}})
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and conforms(choice.message.content)


def test_chat_json_object_and_responses_text_format(sdk) -> None:
    completion = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], temperature=1.0, seed=3, max_tokens=200,
        response_format={"type": "json_object"})
    if completion.choices[0].finish_reason == "stop":  # a random model may fill the budget inside the object
        assert isinstance(json.loads(completion.choices[0].message.content), dict)
    response = sdk.responses.create(model="tiny", input="Is it good?", temperature=1.0, max_output_tokens=60,
                                    text={"format": {"type": "json_schema", "name": "v", "schema": SCHEMA}})
    assert response.status == "completed" and conforms(response.output_text)


def test_a_schema_the_fence_cannot_compile_is_a_400(sdk) -> None:
    bad = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                    response_format={"type": "json_schema", "json_schema": {"name": "b", "schema": bad}})
    assert "missing" in str(caught.value)
