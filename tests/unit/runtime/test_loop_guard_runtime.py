"""The loop guard in the engine loop: a model stuck repeating is first steered off the loop (its next token
banned), and when it keeps looping the request ends with REPETITION, its text kept; varied output never
trips it."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.tiny_models import scripted_output
from zllm.canonical import ChatRequest, Finished, FinishReason, Message, SamplingParams, TextDelta
from zllm.runtime.client import LocalEngineClient


@pytest.fixture
def client(tiny_qwen):
    engine = LocalEngineClient(tiny_qwen, "tiny", 0, prefix_cache=False)
    yield engine
    engine.close()


def generate(client: LocalEngineClient, max_tokens: int, **sampling) -> tuple[str, Finished]:
    async def main():
        request = ChatRequest(id="r", model="tiny", messages=(Message("user", "go"),),
                              sampling=SamplingParams(max_tokens=max_tokens, **sampling))
        text, finished = "", None
        async for event in await client.submit(request):
            text += event.text if isinstance(event, TextDelta) else ""
            finished = event if isinstance(event, Finished) else finished
        return text, finished
    return asyncio.run(asyncio.wait_for(main(), 60))


def test_a_model_that_keeps_looping_ends_with_repetition(client, tiny_qwen) -> None:
    phrase = tiny_qwen.tokenizer.encode(" and then the same thing again", add_special_tokens=False)
    budget = len(phrase) * 100
    with scripted_output(tiny_qwen.model, phrase * 100):  # the script insists, whatever gets banned
        text, finished = generate(client, max_tokens=budget, temperature=0)
    assert finished.reason is FinishReason.REPETITION
    # detected after ~64 tokens, banned 3 times (each ban breaks the pattern; it takes ~64 tokens to be back)
    assert finished.usage.completion_tokens < budget // 2, "stopped long before the budget ran out"
    assert text.startswith(" and then the same thing again and then")  # what came before the stop is kept


@pytest.mark.parametrize("seed", range(5))
def test_varied_output_is_left_alone(client, seed) -> None:
    _, finished = generate(client, max_tokens=150, temperature=1.0, seed=seed)
    assert finished.reason is FinishReason.LENGTH
