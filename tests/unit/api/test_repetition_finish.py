"""A generation the loop guard stopped (FinishReason.REPETITION) is reported distinctly by all three APIs,
streaming and not: Chat `finish_reason: "repetition"`, Responses `incomplete` with reason "repetition",
Anthropic `stop_reason: "repetition"`. The text produced before the stop is kept."""

from __future__ import annotations

import anthropic
import openai

from tests.support.fake_engine import text_events
from zllm.canonical import FinishReason


def looped(engine):
    engine.script(text_events("the", " the", " the", reason=FinishReason.REPETITION))


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0)


def test_chat_completions(engine, serve) -> None:
    client = sdk(serve(engine))
    looped(engine)
    choice = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}]).choices[0]
    assert choice.finish_reason == "repetition" and choice.message.content == "the the the"
    looped(engine)
    chunks = list(client.chat.completions.create(model="fake-model", stream=True,
                                                 messages=[{"role": "user", "content": "x"}]))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "repetition"


def test_responses(engine, serve) -> None:
    client = sdk(serve(engine))
    looped(engine)
    response = client.responses.create(model="fake-model", input="x")
    assert response.status == "incomplete" and response.incomplete_details.reason == "repetition"
    assert response.output_text == "the the the"
    looped(engine)
    events = list(client.responses.create(model="fake-model", input="x", stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "repetition"


def test_anthropic_messages(engine, serve) -> None:
    server = serve(engine)
    looped(engine)
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    message = client.messages.create(model="fake-model", max_tokens=16, messages=[{"role": "user", "content": "x"}])
    assert message.stop_reason == "repetition" and message.content[0].text == "the the the"
    looped(engine)
    with client.messages.stream(model="fake-model", max_tokens=16,
                                messages=[{"role": "user", "content": "x"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "repetition"
