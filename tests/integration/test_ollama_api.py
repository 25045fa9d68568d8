"""The Ollama API end to end: the official `ollama` client against a real daemon, beside the openai SDK on the
same port, so a conversation through /api/chat and /v1/chat/completions meets the same prefix-cache entries."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import ollama
import openai
import pytest

from tests.integration.conftest import TINY
from tests.support.daemon import Daemon
from tests.support.tiny_models import tiny_llama_dir
from zllm.models import ModelStore

KEY = "test-key"
# room for a system prompt, a tool and a tool-call turn (the shared fixtures' 192 is too small)
CONTEXT = 512
HELLO = [{"role": "user", "content": "Say hello."}]
GREEDY = {"temperature": 0, "seed": 1}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def daemon(tiny_data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """A daemon with a store of its own (the served model linked in), so pulls never touch the shared store;
    the hub is unreachable (port 9), so a hub pull fails at once."""
    data_dir = tmp_path_factory.mktemp("ollama-data")
    (data_dir / "models").mkdir()
    (data_dir / "models" / TINY).symlink_to(ModelStore(tiny_data_dir / "models").get(TINY).path)
    proc = Daemon(data_dir, TINY, "--context-length", str(CONTEXT),
                  env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(data_dir / "hf")}).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture()
def client(daemon: Daemon) -> ollama.Client:
    # the same key as the openai client: the cache namespace follows the key
    return ollama.Client(host=daemon.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


@pytest.fixture()
def openai_client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0, timeout=60)


def post_json(daemon: Daemon, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"{daemon.base_url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_chat_streaming_equals_not_streaming(client: ollama.Client) -> None:
    options = {**GREEDY, "num_predict": 8}
    whole = client.chat(model=TINY, messages=HELLO, options=options, stream=False)
    chunks = list(client.chat(model=TINY, messages=HELLO, options=options, stream=True))
    assert whole.message.content and "".join(c.message.content for c in chunks) == whole.message.content
    final = chunks[-1]
    assert final.done and all(not c.done for c in chunks[:-1])
    # a random-weight model never picks EOS: exactly num_predict tokens, cut by length
    assert (final.eval_count, final.done_reason) == (8, "length") == (whole.eval_count, whole.done_reason)
    assert final.prompt_eval_count == whole.prompt_eval_count > 0
    assert final.total_duration >= final.eval_duration > 0


def test_generate_and_the_latest_tag(client: ollama.Client) -> None:
    answer = client.generate(model=f"{TINY}:latest", prompt="Once upon a time", system="Tell a story.",
                             options={**GREEDY, "num_predict": 4}, stream=False)
    assert answer.response and answer.eval_count == 4 and answer.model == f"{TINY}:latest"
    streamed = "".join(c.response for c in client.generate(model=TINY, prompt="Once upon a time",
                                                           system="Tell a story.",
                                                           options={**GREEDY, "num_predict": 4}, stream=True))
    assert streamed == answer.response


def test_structured_output_through_format(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    answer = client.chat(model=TINY, messages=HELLO, format=schema, options={**GREEDY, "num_predict": 40},
                         stream=False)
    if answer.done_reason == "stop":  # the fence closed the object before num_predict ran out
        assert set(json.loads(answer.message.content)) == {"n"}
    assert answer.message.content.lstrip().startswith("{")


def test_tags_show_ps(client: ollama.Client) -> None:
    assert TINY in [m.model for m in client.list().models]
    shown = client.show(TINY)
    assert "completion" in shown.capabilities and shown.details.family
    assert shown.modelinfo[f"{shown.modelinfo['general.architecture']}.context_length"] == CONTEXT
    assert [(m.model, m.context_length) for m in client.ps().models] == [(TINY, CONTEXT)]


def test_codex_oss_setup_sequence(daemon: Daemon, client: ollama.Client) -> None:
    """What `codex --oss --local-provider ollama` asks before its first turn (shared/design/CLIENTS.md §4.1)."""
    with urllib.request.urlopen(f"{daemon.base_url}/api/version", timeout=10) as response:
        version = json.loads(response.read())["version"]
    assert tuple(int(part) for part in version.split(".")) >= (0, 13, 4)
    with urllib.request.urlopen(f"{daemon.base_url}/api/tags", timeout=10) as response:
        assert TINY in [m["name"] for m in json.loads(response.read())["models"]]
    # Codex pulls a model it does not see listed; the served one succeeds at once
    assert [p.status for p in client.pull(TINY, stream=True)][-1] == "success"


def test_pull_from_a_local_directory_streams_progress(client: ollama.Client) -> None:
    source = tiny_llama_dir()
    before = {m.model for m in client.list().models}
    progress = list(client.pull(str(source), stream=True))
    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    assert len(statuses) > 4  # the store's own stages and byte counts came through
    assert any(p.total and p.completed == p.total for p in progress)
    added = {m.model for m in client.list().models} - before
    assert len(added) == 1
    # a second pull of the same source is instant and still succeeds
    assert client.pull(str(source)).status == "success"


def test_pull_errors_are_ollama_shaped(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        client.pull("llama3.2")  # an Ollama registry name: not a source zllm pulls
    assert caught.value.status_code == 404 and "pull model manifest" in caught.value.error
    with pytest.raises(ollama.ResponseError):  # a hub repository, but the hub is unreachable: an error line
        list(client.pull("someone/some-model", stream=True))
    with pytest.raises(ollama.ResponseError) as caught:  # the upstream's fault, not the request's
        client.pull("someone/some-model", stream=False)
    assert caught.value.status_code == 502


def _openai_tool_history() -> list[dict]:
    return [
        {"role": "system", "content": "You are a weather bot. Answer in one line."},
        {"role": "user", "content": "What is the weather in Paris today, and should I take an umbrella?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "light rain, 14 C"},
    ]


def _ollama_tool_history() -> list[dict]:
    return [
        {"role": "system", "content": "You are a weather bot. Answer in one line."},
        {"role": "user", "content": "What is the weather in Paris today, and should I take an umbrella?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                           "arguments": {"city": "paris"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "light rain, 14 C"},
    ]


def test_the_cache_is_shared_with_chat_completions(daemon: Daemon, client: ollama.Client,
                                                   openai_client: openai.OpenAI) -> None:
    # /api/chat first: the same conversation through Chat Completions then renders the same tokens and hits
    first = client.chat(model=TINY, messages=_ollama_tool_history(), tools=[WEATHER_TOOL],
                        options={**GREEDY, "num_predict": 1}, stream=False)
    second = openai_client.chat.completions.create(model=TINY, messages=_openai_tool_history(), tools=[WEATHER_TOOL],
                                                   max_tokens=1, temperature=0)
    assert second.usage.prompt_tokens == first.prompt_eval_count > 20
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.prompt_eval_count - 16, (cached, first.prompt_eval_count)

    # and the other way: Chat Completions first, /api/chat hits (zllm.cached_tokens, an extension field)
    question = ("Name three rivers of Europe, then three of Asia, then three of Africa, and for each one say which "
                "sea or ocean it flows into and roughly how long it is, in kilometres, in a short table.")
    messages = [{"role": "user", "content": question}]
    warm = openai_client.chat.completions.create(model=TINY, messages=messages, max_tokens=1, temperature=0)
    # a new question: at most the template's opening lines were cached before
    assert warm.usage.prompt_tokens_details.cached_tokens < warm.usage.prompt_tokens - 30
    answer = post_json(daemon, "/api/chat", {"model": TINY, "messages": messages, "stream": False,
                                             "options": {"temperature": 0, "num_predict": 1}})
    assert answer["prompt_eval_count"] == warm.usage.prompt_tokens
    assert answer["zllm"]["cached_tokens"] >= warm.usage.prompt_tokens - 16, answer
