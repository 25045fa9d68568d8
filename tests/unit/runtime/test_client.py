"""LocalEngineClient + engine loop end to end on the tiny Qwen3 model (real tokenizer, random weights)."""

import asyncio
import dataclasses

import pytest
import torch

from tests.support.tiny_models import scripted_output
from zllm.canonical import ChatRequest, Finished, FinishReason, Message, SamplingParams, TextDelta
from zllm.errors import ContextLengthExceeded, ModelNotFound, Overloaded
from zllm.runtime.client import LocalEngineClient
from zllm.runtime.scheduler import SchedulerConfig

MODEL = "tiny"
IM_END = 151645


@pytest.fixture
def make_client(tiny_qwen):
    clients = []

    def make(*, context_length: int | None = None, max_queue: int = 64) -> LocalEngineClient:
        loaded = tiny_qwen if context_length is None else dataclasses.replace(tiny_qwen, context_length=context_length)
        clients.append(LocalEngineClient(loaded, MODEL, created=1700000000, max_queue=max_queue))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client) -> LocalEngineClient:
    return make_client()


def request(text: str = "Hello", rid: str = "req_1", model: str = MODEL, **sampling) -> ChatRequest:
    sampling.setdefault("temperature", 0.0)
    return ChatRequest(id=rid, model=model, messages=(Message("user", text),), sampling=SamplingParams(**sampling))


async def collect(stream) -> tuple[str, Finished, list]:
    events = [event async for event in stream]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return text, events[-1], events


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def assert_one_finished_at_the_end(events: list) -> None:
    assert isinstance(events[-1], Finished)
    assert sum(isinstance(e, Finished) for e in events) == 1


def test_models(client) -> None:
    (card,) = client.models()
    assert (card.id, card.created, card.context_length) == (MODEL, 1700000000, 512)


def test_greedy_stream_equals_generate(client, tiny_qwen) -> None:
    async def main():
        stream = await client.submit(request(max_tokens=24))
        return stream, *(await collect(stream))

    stream, text, finished, events = run(main())
    prompt = list(client.renderer.render(request()).token_ids)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = tiny_qwen.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                       eos_token_id=None, pad_token_id=None)[0, len(prompt):].tolist()
    assert IM_END not in out and 151643 not in out  # else generate and we would legitimately differ
    assert text == tiny_qwen.tokenizer.decode(out, skip_special_tokens=True)
    assert finished.reason is FinishReason.LENGTH
    assert finished.usage.prompt_tokens == stream.prompt_tokens == len(prompt)
    assert finished.usage.completion_tokens == 24 and finished.usage.cached_tokens == 0
    assert_one_finished_at_the_end(events)


def test_max_tokens_gives_length_with_exactly_that_many_tokens(client) -> None:
    for max_tokens in (1, 7):
        _, finished, events = run(_submit_and_collect(client, request(max_tokens=max_tokens)))
        assert finished.reason is FinishReason.LENGTH and finished.usage.completion_tokens == max_tokens
        assert_one_finished_at_the_end(events)


async def _submit_and_collect(client, req):
    return await collect(await client.submit(req))


def test_eos_gives_stop_and_is_not_emitted(client, tiny_qwen) -> None:
    hello = tiny_qwen.tokenizer.encode("Hi!", add_special_tokens=False)
    with scripted_output(tiny_qwen.model, [*hello, IM_END]):
        text, finished, _ = run(_submit_and_collect(client, request(max_tokens=50)))
    assert (text, finished.reason, finished.usage.completion_tokens) == ("Hi!", FinishReason.STOP, len(hello) + 1)
    assert finished.stop_sequence is None


def test_stop_string_across_tokens(client, tiny_qwen) -> None:
    script = tiny_qwen.tokenizer.encode("answer: 42</done> ignored", add_special_tokens=False)
    with scripted_output(tiny_qwen.model, script):
        text, finished, events = run(_submit_and_collect(client, request(max_tokens=50, stop=("</done>",))))
    assert (text, finished.reason, finished.stop_sequence) == ("answer: 42", FinishReason.STOP_SEQUENCE, "</done>")
    assert not any("<" in e.text for e in events if isinstance(e, TextDelta))  # the stop's start never leaked


def test_client_stop_token_id(client, tiny_qwen) -> None:
    script = tiny_qwen.tokenizer.encode("call<tool_call>{", add_special_tokens=False)
    with scripted_output(tiny_qwen.model, script):
        text, finished, _ = run(_submit_and_collect(client, request(max_tokens=50, stop_token_ids=(151657,))))
    assert (text, finished.reason, finished.stop_sequence) == ("call", FinishReason.STOP_SEQUENCE, "<tool_call>")


def test_max_tokens_is_clamped_to_the_window(make_client) -> None:
    client = make_client(context_length=40)
    prompt_tokens = run(client.count_tokens(request()))
    for max_tokens in (None, 1000):
        _, finished, _ = run(_submit_and_collect(client, request(max_tokens=max_tokens)))
        assert finished.reason is FinishReason.LENGTH
        assert finished.usage.completion_tokens == 40 - prompt_tokens


def test_prompt_that_fills_the_window_is_rejected(make_client) -> None:
    probe = make_client()
    prompt_tokens = run(probe.count_tokens(request()))
    client = make_client(context_length=prompt_tokens)
    with pytest.raises(ContextLengthExceeded) as info:
        run(client.submit(request()))
    assert (info.value.prompt_tokens, info.value.max_context) == (prompt_tokens, prompt_tokens)
    # one more token of room is enough
    _, finished, _ = run(_submit_and_collect(make_client(context_length=prompt_tokens + 1), request()))
    assert finished.usage.completion_tokens == 1


def test_check_is_what_submit_checks_without_queueing(client) -> None:
    """EngineClient.check: what the Responses edge asks of a `generate: false` turn (openai_responses/turn.py)."""
    too_long = request("word " * 600)
    prompt_tokens = run(client.count_tokens(too_long))
    with pytest.raises(ContextLengthExceeded) as info:
        run(client.check(MODEL, too_long))
    assert (info.value.prompt_tokens, info.value.max_context) == (prompt_tokens, 512)
    run(client.check(MODEL))  # no request: only the model is checked
    run(client.check(MODEL, request()))
    with pytest.raises(ModelNotFound):
        run(client.check("other"))
    assert client.queue_waiting == 0


def test_unknown_model(client) -> None:
    with pytest.raises(ModelNotFound):
        run(client.submit(request(model="other")))
    with pytest.raises(ModelNotFound):
        run(client.count_tokens(request(model="other")))


def test_count_tokens_equals_submit_prompt_tokens(client) -> None:
    req = request("count these tokens, please: 日本語 🎉" * 5, max_tokens=1)

    async def main():
        counted = await client.count_tokens(req)
        stream = await client.submit(req)
        await collect(stream)
        return counted, stream.prompt_tokens

    counted, submitted = run(main())
    assert counted == submitted > 0


def test_concurrent_submits_all_complete(client) -> None:
    async def main():
        streams = await asyncio.gather(*(client.submit(request(f"q{i}", rid=f"r{i}", max_tokens=5 + i))
                                         for i in range(6)))
        return await asyncio.gather(*(collect(s) for s in streams))

    results = run(main())
    for i, (_, finished, events) in enumerate(results):
        assert finished.reason is FinishReason.LENGTH and finished.usage.completion_tokens == 5 + i
        assert_one_finished_at_the_end(events)


def test_same_seed_same_text(client) -> None:
    def sample(seed):
        return run(_submit_and_collect(client, request(temperature=1.0, seed=seed, max_tokens=12)))[0]

    assert sample(5) == sample(5)


def test_abort_mid_decode(client) -> None:
    async def main():
        stream = await client.submit(request(max_tokens=400))
        events = []
        async for event in stream:
            events.append(event)
            if len(events) == 2:
                stream.abort()
                stream.abort()  # idempotent
        return events

    events = run(main())
    assert events[-1].reason is FinishReason.ABORT
    assert events[-1].usage.completion_tokens < 400
    assert_one_finished_at_the_end(events)


def test_abort_while_queued_never_runs(client) -> None:
    prefilled = set()  # the caches that got prompt tokens (a prefill chunk is a segment of several tokens)
    runner = client.engine.engine
    original = runner.forward_rows

    def forward_rows(segments):
        prefilled.update(id(segment.cache) for segment in segments if len(segment.token_ids) > 1)
        return original(segments)

    runner.forward_rows = forward_rows

    async def main():
        first = await client.submit(request("first", rid="a", max_tokens=300))
        queued = await client.submit(request("second", rid="b", max_tokens=300))
        queued.abort()
        first_iter = first.__aiter__()
        await first_iter.__anext__()  # the first one is running now
        first.abort()
        return await collect(queued), [e async for e in first_iter]

    (text, finished, events), _ = run(main())
    assert (text, finished.reason, finished.usage.completion_tokens) == ("", FinishReason.ABORT, 0)
    assert events == [finished] and len(prefilled) == 1


def test_error_in_one_request_then_the_next_works(client) -> None:
    runner = client.engine.engine
    original = runner.forward_rows
    calls = {"n": 0}

    def failing_once(segments):  # forward 1 is the prefill, then one per token: the 3rd token's forward fails
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("boom")
        return original(segments)

    runner.forward_rows = failing_once
    _, failed, events = run(_submit_and_collect(client, request(max_tokens=10)))
    assert failed.reason is FinishReason.ERROR
    # the client is told the engine failed, never the exception's own text (that goes to the log)
    assert failed.error_code == "engine_error" and "boom" not in failed.error_message
    assert "daemon log" in failed.error_message
    assert failed.usage.completion_tokens == 3
    assert_one_finished_at_the_end(events)
    _, ok, _ = run(_submit_and_collect(client, request(max_tokens=4)))
    assert ok.reason is FinishReason.LENGTH and ok.usage.completion_tokens == 4


def test_overloaded_when_the_queue_is_full(make_client) -> None:
    client = make_client(max_queue=1)

    async def main():
        running = await client.submit(request(rid="a", max_tokens=300))
        running_iter = running.__aiter__()
        await running_iter.__anext__()  # picked up by the engine: no longer waiting
        waiting = await client.submit(request(rid="b", max_tokens=300))
        with pytest.raises(Overloaded):
            await client.submit(request(rid="c"))
        waiting.abort()
        running.abort()
        return await collect(waiting), [e async for e in running_iter]

    (_, waiting_finished, _), running_events = run(main())
    assert waiting_finished.reason is FinishReason.ABORT and running_events[-1].reason is FinishReason.ABORT


def test_close_aborts_live_requests_and_refuses_new_ones(client) -> None:
    async def main():
        running = await client.submit(request(rid="a", max_tokens=400))
        queued = await client.submit(request(rid="b", max_tokens=400))
        it = running.__aiter__()
        await it.__anext__()
        await client.aclose()
        with pytest.raises(Overloaded):
            await client.submit(request(rid="c"))
        return [e async for e in it], await collect(queued)

    running_events, (_, queued_finished, queued_events) = run(main())
    assert running_events[-1].reason is FinishReason.ABORT
    # "b" may have joined "a"'s batch before the close (under load, often): aborted either way, never run out
    assert queued_finished.reason is FinishReason.ABORT and len(queued_events) < 400
    assert not client.engine._thread.is_alive()


def test_leaving_the_iteration_early_aborts(client) -> None:
    async def main():
        stream = await client.submit(request(max_tokens=400))
        iterator = stream.__aiter__()
        await iterator.__anext__()
        await iterator.aclose()  # what `break` + garbage collection (or an HTTP disconnect) amounts to
        return stream._engine_request.aborted.is_set()

    assert run(main())
    # the engine is free again
    _, finished, _ = run(_submit_and_collect(client, request(max_tokens=2)))
    assert finished.reason is FinishReason.LENGTH


def test_local_client_applies_the_settings(tmp_path) -> None:
    from tests.support.tiny_models import tiny_llama_dir
    from zllm.config import Settings

    settings = Settings(device="cpu", threads=1, context_length=64, max_queue=3, data_dir=tmp_path)
    from zllm.engines import local_client

    client = local_client(tiny_llama_dir(), settings, name="llama-test", created=7)
    try:
        assert client.models()[0] == dataclasses.replace(client.models()[0], id="llama-test", created=7,
                                                         context_length=64)
        assert client.max_queue == 3 and client.loaded.threads == 1
        _, finished, _ = run(_submit_and_collect(client, request(model="llama-test", max_tokens=3)))
        assert finished.reason is FinishReason.LENGTH
    finally:
        client.close()


def test_the_prompt_split_is_known_before_the_first_event_and_finished_repeats_it(tiny_qwen) -> None:
    """RequestStream.prompt_usage(): what the cache did with the prompt, before any output (Anthropic's
    message_start reports it); cold, then a device hit of the same prompt."""
    reports = []
    client = LocalEngineClient(tiny_qwen, MODEL, created=1, observer=reports.append,
                               scheduler=SchedulerConfig(prefill_chunk=4, idle_prefill_chunk=4))
    try:
        async def ask(rid: str):
            stream = await client.submit(request("Count the files in this repository, please.", rid=rid,
                                                 max_tokens=2))
            split = await stream.prompt_usage()
            *_, finished = [event async for event in stream]
            return stream, split, finished

        for rid in ("cold", "warm"):
            stream, split, finished = run(ask(rid))
            assert split == dataclasses.replace(finished.usage, completion_tokens=0)
            assert split.cache_write_tokens == finished.usage.cache_write_tokens
            assert split.cached_tokens + split.cache_write_tokens == split.prompt_tokens == stream.prompt_tokens
            assert (split.cached_tokens == 0) == (rid == "cold")
        # a prefill of several chunks is reported as it begins: the restored prefix is all it holds yet
        progress = next(r for r in reports if r.phase == "prefilling" and r.request_id == "cold")
        assert (progress.prefilled_tokens, progress.prompt_tokens) == (0, stream.prompt_tokens)
        started = next(r for r in reports if r.phase == "started" and r.request_id == "cold")
        assert started.prefilled_tokens == started.prompt_tokens
    finally:
        client.close()


def test_a_request_that_never_starts_still_resolves_its_split(client) -> None:
    async def main():
        stream = await client.submit(request(max_tokens=2))
        stream.abort()  # usually before admission; either way the split arrives before Finished
        *_, finished = [event async for event in stream]
        return await asyncio.wait_for(stream.prompt_usage(), 5), finished

    split, finished = run(main())
    assert split.prompt_tokens == finished.usage.prompt_tokens and split.completion_tokens == 0


def test_cache_diagnosis_goes_through_the_clients_declared_methods(client) -> None:
    """EngineClient.diagnose_cache compares an admitted request with the prompt kept under an earlier response id
    and keeps this one; ServedEngine.cache_diagnosis (the control socket's `explain-miss --id`) reads it back."""
    async def turn(system: str, rid: str, previous: str | None):
        stream = await client.submit(ChatRequest(id=rid, model=MODEL, sampling=SamplingParams(max_tokens=1),
                                                 messages=(Message("system", system), Message("user", "List it."))))
        diagnosis = await client.diagnose_cache(stream, namespace="ns", response_id=rid, previous_id=previous)
        await collect(stream)
        return diagnosis

    async def conversation():
        return (await turn("Be terse. Now: 2026-12-01 10:00 UTC.", "msg_1", None),
                await turn("Be terse. Now: 2026-12-01 10:05 UTC.", "msg_2", "msg_1"),
                await turn("Be terse.", "msg_3", "msg_unknown"))

    first, second, unknown = run(conversation())
    assert first is None and unknown.reason == "not_found"
    assert (second.reason, second.segment, second.cause) == ("system", "system", "timestamp")
    namespace, kept = client.cache_diagnosis("msg_2")
    assert namespace == "ns" and kept == second
    assert client.cache_diagnosis("msg_1") is None  # kept, but no comparison was asked for
