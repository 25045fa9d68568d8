"""A slow prefill on the real engine, served by the real app on a real port, read by the real SDKs: while the
prompt prefills, each stream sends heartbeat events at their interval, and the SDK's final message and usage
are what they would be without them.

The tiny random-weight Qwen model prefills in small chunks and a step tap sleeps on each prompt chunk, so the
prefill lasts about a second and a half; heartbeat events come every 0.1 s (api/stream_pump.py's setting, a minute
in the daemon). Claude Code's and Codex's watchdogs count such events; the real Claude Code run against a
5-minute prefill is in the report of issue 20.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import anthropic
import openai
import pytest
from anthropic.lib.streaming._messages import accumulate_event

from tests.support.http_server import ThreadedServer
from tests.support.step_tap import StepTap
from tests.support.tiny_models import tiny_qwen_dir
from zllm.api import create_app
from zllm.engine.torch.loader import load_model
from zllm.runtime.client import LocalEngineClient
from zllm.runtime.scheduler import SchedulerConfig

MODEL = "tiny"
EVENT_S = 0.1
CHUNK = 32
SLOW_S_PER_TOKEN = 0.005  # ~300 prompt tokens: ~1.5 s of prefill in ~10 steps


def sleep_on_prefill(rows, lengths, outputs):
    prompt_tokens = sum(len(row.token_ids) for row in rows if len(row.token_ids) > 1 and not row.all_logits)
    time.sleep(prompt_tokens * SLOW_S_PER_TOKEN)
    return outputs


@pytest.fixture(scope="module")
def server():
    loaded = dataclasses.replace(load_model(tiny_qwen_dir(), device="cpu", threads=1), context_length=4096)
    client = LocalEngineClient(loaded, MODEL, 0, scheduler=SchedulerConfig(prefill_chunk=CHUNK,
                                                                          idle_prefill_chunk=CHUNK))
    tap = StepTap(client)
    tap.listeners.append(sleep_on_prefill)
    with ThreadedServer(create_app(client, sse_heartbeat_s=0.05, sse_event_heartbeat_s=EVENT_S)) as running:
        yield running
    tap.remove()
    client.close()


def prompt(nonce: str) -> list[dict]:
    # a prompt of its own per test: a prefix cache hit would skip the slow prefill
    return [{"role": "user", "content": f"{nonce}: " + "tell me about the weather " * 50}]


def is_heartbeat(event) -> bool:
    return event.type == "message_delta" and event.delta.stop_reason is None


def test_a_slow_prefill_sends_counted_events_and_leaves_the_message_and_usage_alone(server) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0, timeout=60)
    messages = prompt("messages")
    prompt_tokens = client.messages.count_tokens(model=MODEL, messages=messages).input_tokens
    arrivals = []
    with client.messages.create(model=MODEL, max_tokens=8, messages=messages, stream=True) as stream:
        for event in stream:
            arrivals.append((time.monotonic(), event))
    events = [event for _, event in arrivals]
    first_block = next(i for i, e in enumerate(events) if e.type == "content_block_start")
    prefill = arrivals[:first_block]  # message_start, then the wait for the first token
    beats = [e for _, e in prefill if is_heartbeat(e)]
    took = prefill[-1][0] - prefill[0][0]
    assert took > 1.0 and len(beats) >= 5  # ~1.5 s of prefill at one event per 0.1 s
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(prefill)]
    assert max(gaps) < 3 * EVENT_S, gaps  # no silence a watchdog could count
    assert all(is_heartbeat(e) for e in events[1:first_block] if e.type != "ping")

    def final(stream_events):
        snapshot, json_bufs = None, {}
        for event in stream_events:
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
        return snapshot.model_dump()

    with_beats, without = final(events), final([e for e in events if not is_heartbeat(e)])
    assert with_beats == without
    usage = with_beats["usage"]
    assert usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"] == \
        prompt_tokens
    assert usage["output_tokens"] == events[-2].usage.output_tokens > 0  # the last message_delta's


def test_the_sdks_message_stream_gets_its_final_message_through_the_heartbeats(server) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0, timeout=60)
    messages = prompt("stream helper")
    with client.messages.stream(model=MODEL, max_tokens=8, messages=messages) as stream:
        beats = sum(is_heartbeat(event) for event in stream)
        message = stream.get_final_message()
    assert beats >= 5 and message.stop_reason in ("max_tokens", "end_turn") and message.usage.output_tokens > 0
    assert message.usage.input_tokens + message.usage.cache_creation_input_tokens + \
        message.usage.cache_read_input_tokens == client.messages.count_tokens(model=MODEL, messages=messages).input_tokens


def test_a_slow_prefill_keeps_a_responses_stream_alive_for_codex(server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0, timeout=60)
    with client.responses.stream(model=MODEL, input=prompt("responses")[0]["content"], max_output_tokens=8) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    first_output = kinds.index("response.output_item.added")
    assert kinds[:first_output].count("response.in_progress") >= 5
    # the random model runs out of its 8 tokens: incomplete, which the SDK's stream reports as it came
    assert kinds[-1] == "response.incomplete" and events[-1].response.usage.output_tokens == 8
    assert [e.sequence_number for e in events] == list(range(len(events)))
