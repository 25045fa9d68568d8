"""The prefix cache inside the engine loop: what is kept (prompt + output fed forward, aborted requests too),
what the next turn restores, memory after random aborts, branches sharing memory, restarts, namespaces."""

import asyncio
import dataclasses
import logging
import random

import pytest
import torch

from zllm.canonical import ChatRequest, Finished, FinishReason, Message, SamplingParams, TextDelta
from zllm.engine.torch.cache.state import state_tensors, storage_bytes
from zllm.engine.torch.runner import ModelRunner
from zllm.kvcache import CacheConfig
from zllm.runtime.client import LocalEngineClient

MODEL = "tiny"
SYSTEM = "You are a careful coding agent. " * 8


@pytest.fixture
def make_client(tiny_qwen, tmp_path):
    clients = []

    def make(*, ssd: bool = False, budget: int = 64 << 20, rounds: int = 4, prefix_cache: bool = True, **config):
        loaded = dataclasses.replace(tiny_qwen, context_length=4096)
        config = CacheConfig(device_budget_bytes=budget, rounds=rounds, ssd_dir=tmp_path / "kv" if ssd else None,
                             ssd_min_tokens=1, **config)
        clients.append(LocalEngineClient(loaded, MODEL, 1, cache_config=config, prefix_cache=prefix_cache))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def chat(messages, rid: str, *, max_tokens: int = 12, namespace: str = "") -> ChatRequest:
    return ChatRequest(id=rid, model=MODEL, messages=tuple(messages), namespace=namespace,
                       sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens))


def ask(client: LocalEngineClient, request: ChatRequest, *, abort_after: int | None = None) -> tuple[str, Finished]:
    """Run a request; `abort_after=k` stops listening after k events (the stream then aborts the request)."""
    async def main():
        stream = await client.submit(request)
        text, finished, seen = "", None, 0
        async for event in stream:
            if abort_after is not None and seen >= abort_after:
                break
            seen += 1
            text += event.text if isinstance(event, TextDelta) else ""
            finished = event if isinstance(event, Finished) else None
        return text, finished
    return asyncio.run(asyncio.wait_for(main(), timeout=60))


def settle(client: LocalEngineClient) -> None:
    """Wait until the engine thread has retired every request (an abort returns before the engine notices)."""
    asyncio.run(asyncio.wait_for(_idle(client), timeout=30))


async def _idle(client: LocalEngineClient) -> None:
    while client.engine._live:
        await asyncio.sleep(0.01)


def test_terminal_state_is_prompt_plus_output_except_the_last_token(make_client, tiny_qwen) -> None:
    client = make_client()
    request = chat([Message("system", SYSTEM), Message("user", "Hello")], "r1", max_tokens=12)
    prompt = client.renderer.render(request).token_ids
    _, finished = ask(client, request)
    settle(client)
    entry = client.prefix_cache.graph.entries["r1"]
    sequence = entry.tokens
    ids = torch.tensor([list(prompt)])
    with torch.inference_mode():
        output = tiny_qwen.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                          do_sample=False, eos_token_id=None, pad_token_id=None)[0, len(prompt):]
        assert sequence == (*prompt, *output.tolist()[:-1])  # the 12th token was sampled, never fed forward
        runner = ModelRunner(tiny_qwen.model)
        reference = runner.new_cache()
        runner.prefill(sequence, reference)
    kept = [torch.cat([node.kv[i][j] for node in entry.kv.node.path()], dim=-2) for i in range(2) for j in range(2)]
    want = [t for layer in reference.layers for t in (layer.keys, layer.values)]
    assert max((k - w).abs().max().item() for k, w in zip(kept, want)) < 1e-4
    assert finished.usage.cached_tokens == 0 and entry.prompt_length == len(prompt)


def test_next_turn_restores_prompt_and_output_and_answers_like_a_cold_run(make_client, caplog) -> None:
    client, cold = make_client(), make_client(prefix_cache=False)
    turn1 = [Message("system", SYSTEM), Message("user", "Write a function")]
    text1, first = ask(client, chat(turn1, "t1"))
    turn2 = [*turn1, Message("assistant", text1), Message("user", "Now test it")]
    prompt1 = client.renderer.render(chat(turn1, "x")).token_ids
    with caplog.at_level(logging.INFO, logger="zllm.runtime"):
        text2, second = ask(client, chat(turn2, "t2"))
        settle(client)  # the finish line is logged once the state is kept
    assert second.usage.cached_tokens > len(prompt1)
    assert f"{second.usage.cached_tokens} cached (device)" in caplog.text
    assert (text2, second.usage.prompt_tokens) == (ask(cold, chat(turn2, "c2"))[0], second.usage.prompt_tokens)


def test_an_aborted_request_keeps_its_prefilled_prompt(make_client) -> None:
    client = make_client()
    request = chat([Message("system", SYSTEM), Message("user", "Long answer please")], "a1", max_tokens=200)
    prompt_tokens = len(client.renderer.render(request).token_ids)
    ask(client, request, abort_after=1)
    settle(client)
    assert "a1" in client.prefix_cache.graph.entries
    _, finished = ask(client, dataclasses.replace(request, id="a2", sampling=SamplingParams(temperature=0, max_tokens=2)))
    assert finished.usage.cached_tokens == prompt_tokens - 1


def test_after_random_aborts_resident_bytes_are_what_retained_sessions_account_for(make_client) -> None:
    client = make_client(budget=8 << 20, rounds=2)
    rng = random.Random(4)
    sessions = [[Message("system", SYSTEM), Message("user", f"task {i}")] for i in range(3)]
    for i in range(24):
        s = rng.randrange(len(sessions))
        aborted = rng.random() < 0.4
        text, _ = ask(client, chat(sessions[s], f"q{i}", max_tokens=rng.randrange(2, 10)),
                      abort_after=rng.randrange(0, 3) if aborted else None)
        if not aborted:
            sessions[s] = [*sessions[s], Message("assistant", text), Message("user", f"more {i}")]
    settle(client)
    cache = client.prefix_cache
    cache.check_integrity()
    retained = {id(n): n for e in cache.graph.entries.values() for n in e.kv.node.path()}
    assert cache.kv.held_bytes() == storage_bytes(t for n in retained.values() for t in state_tensors(n.kv))
    assert sum(len(tree.nodes()) for tree in cache.kv.trees.values()) == len(retained)  # nothing else is held
    assert cache.kv.reserved_bytes() == 0 and not any(b.running for b in cache.kv.backings.values())
    assert cache.kv.pool.bytes == cache.kv.pool.idle_bytes()


def test_two_branches_off_a_long_shared_prefix_cost_little_more_than_one(make_client) -> None:
    client = make_client()
    system = " ".join(f"rule{i}: keep functions small." for i in range(220))  # ~1.5K tokens
    ask(client, chat([Message("system", system), Message("user", "branch one")], "b1", max_tokens=8))
    settle(client)  # the terminal state is kept just after the Finished event is sent
    one = client.prefix_cache.kv.held_bytes()
    _, second = ask(client, chat([Message("system", system), Message("user", "branch two")], "b2", max_tokens=8))
    assert second.usage.cached_tokens > 1400
    settle(client)
    assert client.prefix_cache.kv.held_bytes() < 1.2 * one


def test_namespaces_never_share(make_client) -> None:
    client = make_client()
    messages = [Message("system", SYSTEM), Message("user", "hi")]
    ask(client, chat(messages, "n1", namespace="alice"))
    settle(client)
    assert ask(client, chat(messages, "n2", namespace="bob"))[1].usage.cached_tokens == 0
    assert ask(client, chat(messages, "n3", namespace="alice"))[1].usage.cached_tokens > 0


def test_a_restarted_engine_hits_the_ssd_tier_with_the_same_answer(make_client) -> None:
    first = make_client(ssd=True)
    turn1 = [Message("system", SYSTEM), Message("user", "Plan the refactor")]
    text1, _ = ask(first, chat(turn1, "s1"))
    first.close()  # drains the snapshot writer
    turn2 = [*turn1, Message("assistant", text1), Message("user", "Go on")]
    restarted = make_client(ssd=True)
    text2, finished = ask(restarted, chat(turn2, "s2"))
    assert finished.usage.cached_tokens > len(restarted.renderer.render(chat(turn1, "x")).token_ids)
    assert restarted.prefix_cache.stats().ssd_hits == 1
    assert text2 == ask(make_client(prefix_cache=False), chat(turn2, "c"))[0]
    assert finished.reason is FinishReason.LENGTH


def test_a_failed_request_keeps_nothing_and_returns_its_buffers(make_client, monkeypatch) -> None:
    client = make_client()
    messages = [Message("system", SYSTEM), Message("user", "warm up")]
    ask(client, chat(messages, "ok"))

    forward_rows = client.engine.engine.forward_rows

    def broken_decode(segments):  # the prefill (a 12-token suffix) runs; the first decode forward fails
        if all(len(segment.token_ids) == 1 for segment in segments):
            raise RuntimeError("simulated device failure")
        return forward_rows(segments)

    monkeypatch.setattr(client.engine.engine, "forward_rows", broken_decode)
    _, finished = ask(client, chat([*messages, Message("assistant", "x"), Message("user", "again")], "bad"))
    settle(client)
    cache = client.prefix_cache
    assert finished.reason is FinishReason.ERROR and finished.usage.cached_tokens > 0  # it did restore "ok"
    assert "bad" not in cache.graph.entries and "ok" in cache.graph.entries
    assert cache.kv.pool.bytes == cache.kv.pool.idle_bytes()  # the working set came back
    assert cache.kv.reserved_bytes() == 0 and not any(b.running for b in cache.kv.backings.values())
    cache.check_integrity()


def test_a_near_miss_names_the_message_the_requests_diverged_in(make_client, caplog) -> None:
    """Turn 2 edits the middle of an earlier user message (an agent rewriting history): the cache restores up
    to the edit, and the near-miss record and log say it was message 1."""
    client = make_client(near_miss_min_tokens=32, near_miss_fraction=0.5)
    code = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(20))
    turn1 = [Message("system", SYSTEM), Message("user", f"Review this file:\n{code}\nThanks."),
             Message("assistant", "Looks fine."), Message("user", "Now add tests")]
    ask(client, chat(turn1, "t1"))
    edited = code.replace("return x + 15", "return x - 15")
    turn2 = [turn1[0], Message("user", f"Review this file:\n{edited}\nThanks."), *turn1[2:]]
    with caplog.at_level(logging.INFO, logger="zllm"):
        _, second = ask(client, chat(turn2, "t2"))
        settle(client)
    (miss,) = client.prefix_cache.near_misses()
    prompt2 = client.renderer.render(chat(turn2, "x")).token_ids
    assert miss.entry_id == "t1" and miss.in_prompt and second.usage.cached_tokens == miss.divergence
    assert prompt2[:miss.divergence] == client.renderer.render(chat(turn1, "x")).token_ids[:miss.divergence]
    assert miss.segment == "message 1 (user)"
    assert "in the request's message 1 (user)" in caplog.text  # the near-miss line
    assert f"near miss of t1 at token {miss.divergence} in message 1 (user)" in caplog.text  # the finish line
